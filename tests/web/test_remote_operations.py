"""``RemoteOperations`` against the real app: the methods it gained to satisfy the operator
contract (``OperatorApi``) answer as ``Operations`` does on the same store — many tasks at once,
a capped count, run-now, bulk actions on keys and on a filter, the worker listing's page, cursor
and live filter, and ``by`` on the control verbs (checked alike; the API records its token)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from mscheduler import InvalidInput, Operations, RemoteOperations, Task, TransitionRefused, UnknownPlan
from mscheduler.domain.model import TaskStatus
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import WorkerInfo
from mscheduler.web import create_app
from tests.web.support import ADMIN_TOKEN, TOKENS, CountingDriver, publisher, tick


@pytest.fixture
async def remote(operations: Operations) -> AsyncIterator[RemoteOperations]:
    app = create_app(operations=operations, tokens=TOKENS)
    async with RemoteOperations("http://test", ADMIN_TOKEN, transport=httpx.ASGITransport(app=app)) as ops:
        yield ops


async def _send(driver: CountingDriver, keys: list[str], name: str = "job") -> None:
    await publisher(driver).send_many([Task(k, name, None) for k in keys])
    tick(driver)


async def test_get_tasks_answers_the_known_keys_in_the_order_given(
    remote: RemoteOperations, operations: Operations, driver: CountingDriver
) -> None:
    await _send(driver, ["a", "b", "c"])
    keys = ["c", "nope", "a", "c"]
    got = await remote.get_tasks(keys)
    assert list(got) == ["c", "a"]
    assert got == await operations.get_tasks(keys)
    with pytest.raises(InvalidInput, match="keys"):
        await remote.get_tasks("a")


async def test_count_tasks_counts_the_filter_up_to_its_cap(
    remote: RemoteOperations, operations: Operations, driver: CountingDriver
) -> None:
    await _send(driver, [f"t-{i}" for i in range(5)])
    await _send(driver, ["other-1"], name="other")
    assert (await remote.count_tasks(name="job")) == await operations.count_tasks(name="job")
    assert (await remote.count_tasks(name="job")).count == 5
    capped = await remote.count_tasks(cap=3, name="job", limit=1)
    assert (capped.count, capped.capped) == (3, True)
    assert (await remote.count_tasks(key_prefix="other")).count == 1
    with pytest.raises(InvalidInput, match="cap"):
        await remote.count_tasks(cap=0)


async def test_run_plan_now_runs_once_and_a_second_run_at_that_instant_is_refused(
    remote: RemoteOperations, operations: Operations
) -> None:
    timing = PlanTiming(
        schedule=EverySchedule(interval=timedelta(hours=1), start=datetime(2031, 1, 1, tzinfo=UTC))
    )
    await operations.add_plan(Plan(plan_id="sync", name="sync_account", params={"n": 1}, timing=timing))
    run = await remote.run_plan_now("sync")
    assert run.name == "sync_account" and run.status is TaskStatus.PENDING
    assert (await operations.get_task(run.key)).key == run.key
    with pytest.raises(TransitionRefused, match="at this instant exists"):
        await remote.run_plan_now("sync")  # the fake clock has not moved: the same run's key
    with pytest.raises(UnknownPlan):
        await remote.run_plan_now("nope")


async def test_control_many_answers_an_outcome_per_key(
    remote: RemoteOperations, operations: Operations, driver: CountingDriver
) -> None:
    await _send(driver, ["a", "b"])
    await operations.cancel("b")
    outcomes = await remote.control_many("cancel", ["a", "b", "nope"], reason="dup")
    assert [(o.key, o.outcome, o.status) for o in outcomes] == [
        ("a", "done", None),
        ("b", "refused", "cancelled"),
        ("nope", "unknown", None),
    ]
    cancelled = (await operations.get_task("a")).cancelled
    assert cancelled is not None and cancelled["by"] == "api:admin-1"
    before = driver.calls["control_task"]
    with pytest.raises(InvalidInput, match="action"):
        await remote.control_many("explode", ["a"])
    assert driver.calls["control_task"] == before


async def test_control_matching_yields_the_outcomes_until_every_selected_task_is_done(
    remote: RemoteOperations, operations: Operations, driver: CountingDriver
) -> None:
    await _send(driver, [f"inv-{i:03}" for i in range(30)])
    await _send(driver, ["other-1"], name="other")
    pages = await remote.control_matching("pause", name="job", status="pending")
    outcomes = [outcome async for page in pages for outcome in page]
    assert sorted(o.key for o in outcomes) == [f"inv-{i:03}" for i in range(30)]
    assert {o.outcome for o in outcomes} == {"done"}
    assert (await operations.get_task("inv-007")).paused
    assert not (await operations.get_task("other-1")).paused
    with pytest.raises(InvalidInput, match="page_size"):
        await remote.control_matching("pause", page_size=0)
    with pytest.raises(InvalidInput, match="status"):
        await remote.control_matching("pause", status="nope")


async def test_list_workers_pages_by_cursor_and_filters_the_live_ones(
    remote: RemoteOperations, operations: Operations, driver: CountingDriver
) -> None:
    await driver.register_worker(WorkerInfo("w-old", "h", 1, ("job",), 1, driver.clock.now()))
    tick(driver, 60_000)  # w-old is no longer live
    for i in range(3):
        await driver.register_worker(WorkerInfo(f"w-{i}", "h", i, ("job",), 1, driver.clock.now()))
    first = await remote.list_workers(limit=2)
    assert [w.worker_id for w in first] == ["w-old", "w-0"]
    rest = await remote.list_workers(limit=2, after=first[-1].cursor)
    assert [w.worker_id for w in rest] == ["w-1", "w-2"]
    assert rest == await operations.list_workers(limit=2, after=first[-1].cursor)
    live = await remote.list_workers(live=True)
    assert sorted(w.worker_id for w in live) == ["w-0", "w-1", "w-2"]
    with pytest.raises(InvalidInput, match="after"):
        await remote.list_workers(after="not-a-cursor")
    with pytest.raises(InvalidInput, match="limit"):
        await remote.list_workers(limit=0)


async def test_the_control_verbs_take_by_checked_as_operations_checks_it(
    remote: RemoteOperations, operations: Operations, driver: CountingDriver
) -> None:
    await _send(driver, ["a", "b"])
    assert (await remote.pause("a", by="someone")).paused
    await remote.resume("a", by="someone")
    cancelled = (await remote.cancel("a", "done", by="someone")).cancelled
    assert cancelled is not None and cancelled["by"] == "api:admin-1"  # the API's token
    await remote.restart("a", by="someone")
    await remote.remove("b", by="someone")
    assert await operations.get_tasks(["a", "b"]) == {"a": await operations.get_task("a")}
    before = driver.calls["control_task"]
    for verb in (remote.cancel, remote.resume, remote.remove):
        with pytest.raises(InvalidInput, match="by"):
            await verb("a", by="x" * 201)
    assert driver.calls["control_task"] == before
