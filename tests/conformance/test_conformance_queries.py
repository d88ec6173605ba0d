"""find_wakeups, list_tasks, count_by_status, update_option and the worker registry."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import Wakeup, WakeupParams, WorkerInfo
from tests.conformance.support import NAME, Store

# -- find_wakeups ---------------------------------------------------------------------------------


async def _claim_wakeups(
    store: Store, worker: str, names: list[str], limit: int = 100
) -> set[tuple[str, object]]:
    wakeups = await store.driver.find_wakeups(WakeupParams(worker, names, store.now, limit))
    assert all(isinstance(w, Wakeup) for w in wakeups)
    # "lease" wake-ups are a hint some drivers add; the claim times are the contract
    return {(w.key, w.time) for w in wakeups if w.kind == "claim"}


@pytest.mark.global_claim_order
async def test_find_wakeups_lists_claim_times_this_worker_may_use(store: Store) -> None:
    await store.add("due")
    await store.add("future", run_at=store.at(60))
    await store.add("other-name", name="other")
    await store.add("for-w2", specific_worker_ids=("w2",))
    await store.add("for-w1", specific_worker_ids=("w1",), run_at=store.at(5))
    await store.add("busy", priority=9)
    await store.add("done", priority=8)
    assert await store.claim_keys("w9") == ["busy"]
    done = await store.claim_one("w9")
    assert done is not None and done.key == "done"
    assert await store.done(done, "w9") is True

    assert await _claim_wakeups(store, "w1", [NAME]) == {
        ("due", store.now),
        ("future", store.at(60)),
        ("for-w1", store.at(5)),
    }
    assert await _claim_wakeups(store, "w2", [NAME, "other"]) == {
        ("due", store.now),
        ("future", store.at(60)),
        ("for-w2", store.now),
        ("other-name", store.now),
    }
    assert await _claim_wakeups(store, "w1", ["nothing"]) == set()


async def test_find_wakeups_returns_the_earliest_up_to_the_limit(store: Store) -> None:
    for seconds in (30, 10, 40, 20):
        await store.add(f"t{seconds}", run_at=store.at(seconds))
    assert await _claim_wakeups(store, "w1", [NAME], limit=2) == {
        ("t10", store.at(10)),
        ("t20", store.at(20)),
    }


async def test_find_wakeups_follows_retries(store: Store) -> None:
    await store.add("a")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await _claim_wakeups(store, "w1", [NAME]) == set()  # running, no free slot
    assert await store.fail(claimed, "w1", retry_in=15) is True
    assert await _claim_wakeups(store, "w1", [NAME]) == {("a", store.at(15))}


# -- list_tasks / count_by_status -----------------------------------------------------------------


async def _mixed(store: Store) -> None:
    """p1, p2 pending; r running; s succeeded; f failed — created 1 ms apart in that order."""
    for key, name in (("p1", "alpha"), ("r", "beta"), ("s", "alpha"), ("f", "beta"), ("p2", "alpha")):
        priority = 0 if key.startswith("p") else 1  # so the claims below take r, s and f
        await store.add(key, name=name, max_unexpected_retries=0, priority=priority)
        store.advance(0.001)
    for key, name in (("r", "beta"), ("s", "alpha"), ("f", "beta")):
        claimed = await store.claim_one("w1", names=[name])
        assert claimed is not None and claimed.key == key, (key, claimed)
    entries = {k: (await store.entries(k))[0]["attempt"] for k in ("s", "f")}
    assert await store.finish("s", "w1", entries["s"], result="ok") is True
    assert await store.finish("f", "w1", entries["f"], "failed", error={"type": "E", "message": "x"}) is True


@pytest.mark.global_claim_order
async def test_count_by_status(store: Store) -> None:
    assert await store.driver.count_by_status() == {}
    await _mixed(store)
    assert await store.driver.count_by_status() == {"pending": 2, "running": 1, "succeeded": 1, "failed": 1}


@pytest.mark.global_claim_order
async def test_list_tasks_filters_sorts_and_pages(store: Store) -> None:
    await _mixed(store)

    async def keys(**kwargs: object) -> list[str]:
        return [t["key"] for t in await store.driver.list_tasks(ListParams(**kwargs))]  # type: ignore[arg-type]

    assert await keys() == ["p1", "r", "s", "f", "p2"]  # creation order
    assert await keys(status="pending") == ["p1", "p2"]
    assert await keys(status="failed") == ["f"]
    assert await keys(name="alpha") == ["p1", "s", "p2"]
    assert await keys(name="beta", status="running") == ["r"]
    assert await keys(name="gamma") == []
    assert await keys(limit=2) == ["p1", "r"]
    docs = await store.driver.list_tasks(ListParams(status="succeeded"))
    assert docs == [await store.get("s")]
    assert "_id" not in docs[0]


async def test_tasks_created_together_list_in_key_order(store: Store) -> None:
    await store.insert(*(store.task(k) for k in ("c", "a", "b")))
    assert [t["key"] for t in await store.all_tasks()] == ["a", "b", "c"]


# -- update_option --------------------------------------------------------------------------------


async def test_update_option_rederives_claim_at(store: Store) -> None:
    await store.add("a", run_at=store.at(3600))
    assert await store.claim_keys("w1") == []
    store.advance(1)
    option = await store.change_option("a", run_at=store.now, priority=4)
    doc = await store.get("a")
    assert doc["option"] == option
    assert (doc["state"]["claim_at"], doc["state"]["update_time"]) == (store.now, store.now)
    assert await store.claim_keys("w1") == ["a"]


async def test_update_option_can_add_a_slot_to_a_running_task(store: Store) -> None:
    await store.add("a")
    assert await store.claim_keys("w1") == ["a"]
    assert await store.claim_keys("w2") == []
    await store.change_option("a", concurrent_worker_cnt=2)
    state = await store.state("a")
    assert (state["status"], state["free_slots"], state["claim_at"]) == ("running", 1, store.now)
    assert await store.claim_keys("w2") == ["a"]


async def test_update_option_targeting_changes_who_may_claim(store: Store) -> None:
    await store.add("a")
    await store.change_option("a", specific_worker_ids=["w2"])
    state = await store.state("a")
    assert state["targeted"] is True
    assert await store.claim_keys("w1") == []
    await store.change_option("a", specific_worker_ids=[])
    assert (await store.state("a"))["targeted"] is False
    assert await store.claim_keys("w1") == ["a"]


async def test_update_option_lowering_the_budget_fails_the_task(store: Store) -> None:
    await store.add("a", max_unexpected_retries=5)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.fail(claimed, "w1", retry_in=0) is True
    assert await store.status("a") == "pending"
    await store.change_option("a", max_unexpected_retries=0)
    state = await store.state("a")
    assert (state["status"], state["claim_at"]) == ("failed", None)
    await store.change_option("a", max_unexpected_retries=1)
    assert await store.status("a") == "pending"


async def test_update_option_of_an_unknown_task_is_false(store: Store) -> None:
    await store.add("a")
    option = (await store.get("a"))["option"]
    assert await store.update_option("missing", option) is False
    assert [t["key"] for t in await store.all_tasks()] == ["a"]


# -- workers --------------------------------------------------------------------------------------


async def test_worker_registry_round_trip(store: Store) -> None:
    driver = store.driver
    started = store.now
    await driver.register_worker(WorkerInfo("w1", "host-a", 11, ["job", "other"], 4, started))
    store.advance(1)
    await driver.register_worker(WorkerInfo("w2", "host-b", 22, ["job"], 1, store.now, ["gpu", "eu"]))
    workers = {w["worker_id"]: w for w in await driver.list_workers()}
    assert set(workers) == {"w1", "w2"}
    w1 = workers["w1"]
    assert workers["w2"]["groups"] == ["gpu", "eu"]
    expected = {
        "worker_id": "w1",
        "host": "host-a",
        "pid": 11,
        "names": ["job", "other"],
        "groups": [],
        "concurrency": 4,
        "start_time": started,
        "last_seen": started,
        "running_cnt": 0,
        "stop_requested": False,
        "stop_time": None,
    }
    assert {k: w1[k] for k in expected} == expected

    store.advance(5)
    assert await driver.heartbeat_worker("w1", store.now, 3) is False
    w1 = next(w for w in await driver.list_workers() if w["worker_id"] == "w1")
    assert (w1["last_seen"], w1["running_cnt"]) == (store.now, 3)

    assert await driver.request_worker_stop("w1", store.now) is True
    assert await driver.heartbeat_worker("w1", store.now, 2) is True
    assert await driver.heartbeat_worker("w2", store.now, 0) is False  # only w1 was asked

    store.advance(1)
    await driver.unregister_worker("w1", store.now)
    w1 = next(w for w in await driver.list_workers() if w["worker_id"] == "w1")
    assert (w1["stop_time"], w1["last_seen"], w1["running_cnt"]) == (store.now, store.now, 0)
    assert await driver.request_worker_stop("w1", store.now) is False  # already stopped


async def test_registration_keeps_a_pending_stop_of_a_live_registration(store: Store) -> None:
    """An executor is registered by each API server that first sees it: a second registration
    of a live worker must not wipe the stop an operator asked for (nor its start time or running
    count), while a registration after the worker unregistered starts afresh."""
    driver = store.driver
    started = store.now
    assert await driver.register_worker(WorkerInfo("ex", "server-a", 1, ["job"], 2, started)) is False
    assert await driver.heartbeat_worker("ex", store.now, 2) is False
    assert await driver.request_worker_stop("ex", store.now) is True
    store.advance(3)
    # another server sees the executor for the first time: the stop is still pending, and said
    assert await driver.register_worker(WorkerInfo("ex", "server-b", 0, ["job", "x"], 4, store.now)) is True
    [worker] = await driver.list_workers()
    assert (worker["stop_requested"], worker["start_time"], worker["running_cnt"]) == (True, started, 2)
    assert (worker["host"], worker["names"], worker["last_seen"]) == ("server-b", ["job", "x"], store.now)
    assert await driver.heartbeat_worker("ex", store.now, 1) is True

    await driver.unregister_worker("ex", store.now)  # the stop was served
    store.advance(1)
    assert await driver.register_worker(WorkerInfo("ex", "server-a", 1, ["job"], 2, store.now)) is False
    [worker] = await driver.list_workers()
    assert (worker["stop_requested"], worker["stop_time"], worker["start_time"]) == (False, None, store.now)
    assert worker["running_cnt"] == 0
    assert await driver.heartbeat_worker("ex", store.now, 0) is False


async def test_unknown_workers_are_not_invented(store: Store) -> None:
    driver = store.driver
    assert await driver.heartbeat_worker("ghost", store.now, 1) is False
    assert await driver.request_worker_stop("ghost", store.now) is False
    assert await driver.list_workers() == []


async def test_server_time_is_none_or_aware(store: Store) -> None:
    now = await store.driver.server_time()
    assert now is None or (now.tzinfo is not None and now.utcoffset() == timedelta(0))
