"""The worker registry on every driver (issue 18.7): registrations expire once not seen for the
store's worker retention (stopped ones and silent ones), the live workers are read apart, and the
registry is read a page at a time in start order."""

from __future__ import annotations

from datetime import timedelta

from mscheduler.drivers.base import WorkerInfo, WorkerListParams
from tests.conformance.support import NAME, Store


async def _register(store: Store, worker_id: str, started_ago: float) -> None:
    await store.driver.register_worker(WorkerInfo(worker_id, "h", 1, [NAME], 1, store.at(-started_ago)))


async def test_registrations_not_seen_for_the_retention_are_gone(store: Store) -> None:
    day = timedelta(days=1).total_seconds()
    await _register(store, "stopped-long-ago", 2 * day)
    await store.driver.unregister_worker("stopped-long-ago", store.at(-2 * day + 60))
    await _register(store, "silent", 1.5 * day)  # died: its last heartbeat was at its start
    await _register(store, "stopped-today", 3600)
    await store.driver.unregister_worker("stopped-today", store.at(-1800))
    await _register(store, "live", 600)
    await store.driver.heartbeat_worker("live", store.now, 2)
    listed = await store.driver.list_workers(WorkerListParams(store.now))
    assert [w["worker_id"] for w in listed] == ["stopped-today", "live"]
    live = await store.driver.list_workers(WorkerListParams(store.now, live_since=store.at(-30)))
    assert [w["worker_id"] for w in live] == ["live"]


async def test_the_registry_is_read_a_page_at_a_time_in_start_order(store: Store) -> None:
    for i in range(7):
        await _register(store, f"w{i}", 100 - i * 10)
    await _register(store, "w-tie", 40)  # started at w6's time (40 s ago): ties go by id
    seen: list[str] = []
    after = None
    while True:
        page = await store.driver.list_workers(WorkerListParams(store.now, after=after, limit=3))
        seen += [w["worker_id"] for w in page]
        if len(page) < 3:
            break
        after = (page[-1]["start_time"], page[-1]["worker_id"])
    assert seen == ["w0", "w1", "w2", "w3", "w4", "w5", "w-tie", "w6"]


async def test_a_registration_keeps_its_params_schemas_and_lists_them_when_asked(store: Store) -> None:
    """Workers publish their handlers' params schemas with their registration: a live listing
    that asks for them gets them (``schemas``), any other listing leaves them out; registering
    again replaces them."""
    schema = '{"properties":{"order_id":{"type":"integer"}},"required":["order_id"],"type":"object"}'
    info = WorkerInfo("w-s", "h", 1, [NAME, "other"], 1, store.at(-10), schemas=[(NAME, schema)])
    await store.driver.register_worker(info)
    live = WorkerListParams(store.now, live_since=store.at(-30), schemas=True)
    [worker] = await store.driver.list_workers(live)
    assert worker["schemas"] == [{"name": NAME, "schema": schema}]
    for params in (WorkerListParams(store.now), WorkerListParams(store.now, live_since=store.at(-30))):
        [plain] = await store.driver.list_workers(params)
        assert "schemas" not in plain and plain["names"] == [NAME, "other"]
    await store.driver.register_worker(WorkerInfo("w-s", "h", 1, [NAME], 1, store.at(-5)))
    [worker] = await store.driver.list_workers(live)
    assert worker["schemas"] == []
