"""Retention (F10), the attempt-entry cap, uniqueness by params (F16) and batch reads (F18), on
every driver.

``state.finish_time`` is set by the write that makes a task terminal and kept after; the
retention pass removes only finished tasks past their status's period; a claim beyond the entry
cap drops the oldest entries that do not count; a live task holds its params hash.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from mscheduler import Operations, OptionChange, Publisher
from mscheduler.domain.exceptions import InvalidInput, TransitionRefused
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.domain.unique import params_hash
from mscheduler.drivers.base import (
    ClaimParams,
    ControlParams,
    ExpireParams,
    InsertParams,
    NewTask,
    PurgeParams,
    RetentionParams,
    UniqueParamsTaken,
    UpdateOptionParams,
)
from mscheduler.services.planner import Planner
from mscheduler.services.retention import Retention, RetentionService
from tests.conformance.support import NAME, Store

DAY = 24 * 3600.0


async def finished(store: Store, key: str, status: str) -> None:
    """Task ``key`` ending now in ``status`` (succeeded, failed, cancelled or expired)."""
    if status == "expired":
        await store.add(key, deadline=store.at(1))
        store.advance(2)
        await store.driver.expire_deadlines(ExpireParams(store.now))
        await store.check_all()
    elif status == "cancelled":
        await store.add(key)
        await Operations(store.driver, clock=store.clock).cancel(key)
    else:
        await store.add(key, max_unexpected_retries=0)
        claimed = await store.claim_one("w1")
        assert claimed is not None and claimed.key == key
        if status == "succeeded":
            assert await store.done(claimed, "w1")
        else:
            assert await store.fail(claimed, "w1")
    assert await store.status(key) == status


# -- finish time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled", "expired"])
async def test_the_write_that_ends_a_task_sets_its_finish_time(store: Store, status: str) -> None:
    await finished(store, "t", status)
    state = await store.state("t")
    assert state["finish_time"] == store.now


async def test_finish_time_is_kept_by_later_writes_and_cleared_by_a_restart(store: Store) -> None:
    ops = Operations(store.driver, clock=store.clock)
    await store.add("t")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert (await store.state("t"))["finish_time"] is None  # running
    await ops.cancel("t")
    ended = store.now
    store.advance(60)
    await store.expire()  # a later write on the cancelled task: its entry becomes lost
    store.advance(60)
    assert await store.expire() == 0
    assert (await store.state("t"))["finish_time"] == ended
    await ops.restart("t")
    assert (await store.state("t"))["finish_time"] is None


# -- the retention pass --------------------------------------------------------------------------


async def test_retention_removes_only_finished_tasks_past_their_period(store: Store) -> None:
    for status in ("succeeded", "failed", "cancelled", "expired"):
        await finished(store, f"old-{status}", status)
    store.advance(8 * DAY)
    for status in ("succeeded", "failed", "cancelled", "expired"):
        await finished(store, f"new-{status}", status)
    await store.add("pending")
    await store.add("running", max_unexpected_retries=0)
    assert await store.claim_one("w1") is not None
    store.advance(DAY)

    service = RetentionService(store.driver, Retention(succeeded=timedelta(days=7)), clock=store.clock)
    assert await service.run_once() == 1  # failed, cancelled, expired: 30 days
    left = {doc["key"] for doc in await store.all_tasks()}
    assert "old-succeeded" not in left
    assert left >= {"old-failed", "old-cancelled", "old-expired", "new-succeeded", "pending", "running"}

    store.advance(30 * DAY)
    assert await service.run_once() == 7  # the 3 old ones left and the 4 new ones
    assert {doc["key"] for doc in await store.all_tasks()} == {"pending", "running"}
    assert service.removed == 8


async def test_retention_none_keeps_tasks_of_that_status_for_ever(store: Store) -> None:
    await finished(store, "s", "succeeded")
    await finished(store, "f", "failed")
    store.advance(5000 * DAY)
    service = RetentionService(store.driver, Retention(succeeded=None, failed=None), clock=store.clock)
    assert await service.run_once() == 0
    assert {doc["key"] for doc in await store.all_tasks()} == {"s", "f"}


async def test_the_pass_removes_in_bounded_batches_oldest_first(store: Store) -> None:
    for i in range(7):
        await finished(store, f"t{i}", "succeeded")
        store.advance(1)
    cutoff = store.now
    removed = await store.driver.purge_finished(
        PurgeParams("succeeded", cutoff - timedelta(seconds=3), limit=2)
    )
    assert removed == 2
    assert {doc["key"] for doc in await store.all_tasks()} == {f"t{i}" for i in range(2, 7)}
    service = RetentionService(
        store.driver, Retention(succeeded=timedelta(seconds=1)), clock=store.clock, batch=2
    )
    assert await service.run_once() == 5  # three batches: 2, 2, 1
    assert await store.all_tasks() == []


async def test_a_task_restarted_after_it_finished_is_not_removed(store: Store) -> None:
    ops = Operations(store.driver, clock=store.clock)
    await finished(store, "t", "failed")
    store.advance(40 * DAY)
    await ops.restart("t")  # live again: its finish time is gone
    assert await store.driver.purge_finished(PurgeParams("failed", store.now, limit=10)) == 0
    assert await store.status("t") == "pending"


async def test_ensure_retention_is_idempotent_and_follows_changed_periods(store: Store) -> None:
    first = await store.driver.ensure_retention(RetentionParams(Retention().periods()))
    again = await store.driver.ensure_retention(RetentionParams(Retention().periods()))
    changed = await store.driver.ensure_retention(
        RetentionParams(Retention(succeeded=timedelta(hours=1), failed=None).periods())
    )
    assert first == again == changed  # the same answer for one store: TTL in place or not
    await finished(store, "t", "succeeded")
    store.advance(2 * 3600)
    service = RetentionService(store.driver, Retention(succeeded=timedelta(hours=1)), clock=store.clock)
    assert await service.run_once() == 1


# -- the attempt-entry cap -----------------------------------------------------------------------


async def test_a_claim_beyond_the_cap_drops_the_oldest_uncounted_entries(store: Store) -> None:
    await store.add("t", max_unexpected_retries=5)
    statuses = ["released", "failed", "released", "revoked", "failed", "released"]
    for i, outcome in enumerate(statuses):
        claimed = await store.claim_one(f"w{i}")
        assert claimed is not None
        if outcome == "failed":
            assert await store.fail(claimed, f"w{i}", retry_in=0)
        else:
            assert await store.finish("t", f"w{i}", claimed.attempt, outcome)
    before = [e["attempt"] for e in await store.entries("t")]
    assert len(before) == 6

    params_cap = 4
    claimed_list = await store.driver.claim(
        ClaimParams(worker_id="w9", names=[NAME], now=store.now, attempts=["w9#x"], max_entries=params_cap)
    )
    await store.check_all()
    assert [c.key for c in claimed_list] == ["t"]
    entries = await store.entries("t")
    # 7 entries, cap 4: the three oldest uncounted ones go (released, released, revoked)
    assert [e["status"] for e in entries] == ["failed", "failed", "released", "running"]
    assert [e["attempt"] for e in entries] == [before[1], before[4], before[5], "w9#x"]
    assert claimed_list[0].attempt_no == 4
    assert (await store.state("t"))["fail_cnt"] == 2


async def test_counted_entries_are_never_dropped_even_beyond_the_cap(store: Store) -> None:
    await store.add("t", max_unexpected_retries=10)
    for i in range(3):
        claimed = (
            await store.driver.claim(
                ClaimParams(worker_id=f"w{i}", names=[NAME], now=store.now, attempts=[f"a{i}"], max_entries=2)
            )
        )[0]
        assert await store.fail(claimed, f"w{i}", retry_in=0)
    entries = await store.entries("t")
    assert [e["status"] for e in entries] == ["failed", "failed", "failed"]
    assert (await store.state("t"))["fail_cnt"] == 3


# -- uniqueness by params ------------------------------------------------------------------------


def unique_task(store: Store, key: str, params: object, **option: object) -> NewTask:
    if getattr(store.driver, "sharded", False):
        pytest.skip("uniqueness by params is not offered on a sharded store (docs/scaling.md)")
    return _unique(store, key, params, **option)


def _unique(store: Store, key: str, params: object, **option: object) -> NewTask:
    task = store.task(key, NAME, params, **option)
    return NewTask(
        task.key, task.name, task.params, task.option, unique_hash=params_hash(task.name, task.params)
    )


async def test_a_sharded_store_refuses_uniqueness_by_params(store: Store) -> None:
    """A unique index must be prefixed by the shard key: a task unique by params is refused with
    the reason (make the key from the params instead), and nothing is written."""
    if not getattr(store.driver, "sharded", False):
        pytest.skip("a sharded store's rule")
    with pytest.raises(InvalidInput, match="sharded store"):
        await store.insert(_unique(store, "a", {"n": 1}))
    assert await store.driver.get_task("a") is None


async def test_a_live_task_holds_its_params_until_it_finishes(store: Store) -> None:
    assert await store.insert(unique_task(store, "a", {"x": 1, "y": 2})) == [True]
    # same params in another key order: refused like an existing key, nothing written
    assert await store.insert(unique_task(store, "b", {"y": 2, "x": 1})) == [False]
    assert await store.driver.get_task("b") is None
    # other params, or the same params without unique_by: created
    assert await store.insert(unique_task(store, "c", {"x": 2, "y": 2})) == [True]
    assert await store.add("d", params={"x": 1, "y": 2})
    claimed = await store.claim("w1", 3)
    assert {c.key for c in claimed} == {"a", "c", "d"}
    assert await store.insert(unique_task(store, "b", {"x": 1, "y": 2})) == [False]  # running
    a = next(c for c in claimed if c.key == "a")
    assert await store.done(a, "w1")
    assert await store.insert(unique_task(store, "b", {"x": 1, "y": 2})) == [True]  # a finished


async def test_a_restart_of_a_task_whose_params_are_taken_is_refused(store: Store) -> None:
    ops = Operations(store.driver, clock=store.clock)
    assert await store.insert(unique_task(store, "a", {"n": 1}, max_unexpected_retries=0)) == [True]
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.fail(claimed, "w1")
    assert await store.insert(unique_task(store, "b", {"n": 1})) == [True]
    before = await store.get("a")
    with pytest.raises(UniqueParamsTaken) as raised:
        await store.driver.control_task(ControlParams("a", "restart", ("failed",), store.now))
    assert raised.value.holder == "b"
    with pytest.raises(TransitionRefused) as refused:
        await ops.restart("a")
    assert refused.value.status == "failed" and "'b'" in refused.value.rule
    assert await store.get("a") == before  # nothing changed
    # a reset of the finished task is refused as well (reported not created)
    assert await store.insert(unique_task(store, "a", {"n": 1}), reset_finished=True) == [False]
    assert await store.get("a") == before
    # once b is gone, a may run again
    await ops.remove("b")
    assert (await ops.restart("a")).status.value == "pending"


async def test_an_edit_that_revives_a_task_whose_params_are_taken_is_refused(store: Store) -> None:
    """Raising the retry budget of a task that failed for good makes it pending again: while
    another live task holds its params hash the store refuses it (``UniqueParamsTaken`` naming
    the holder; a raw duplicate key error on MongoDB before), and nothing changes."""
    assert await store.insert(unique_task(store, "a", {"n": 1}, max_unexpected_retries=0)) == [True]
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.fail(claimed, "w1")
    assert await store.insert(unique_task(store, "b", {"n": 1})) == [True]
    before = await store.get("a")
    revived = dict(before["option"]) | {"max_unexpected_retries": 3}
    with pytest.raises(UniqueParamsTaken) as raised:
        await store.driver.update_option(UpdateOptionParams("a", revived, store.now))
    assert raised.value.holder == "b"
    assert await store.get("a") == before
    with pytest.raises(TransitionRefused) as refused:
        await Publisher(store.driver, clock=store.clock).update_option(
            "a", OptionChange(max_unexpected_retries=3)
        )
    assert refused.value.status == "failed" and "'b'" in refused.value.rule
    assert await store.get("a") == before


async def test_concurrent_sends_of_equal_params_make_one_task(store: Store) -> None:
    results = await asyncio.gather(
        *(
            store.driver.insert_tasks(InsertParams([unique_task(store, f"k{i}", {"p": [1, 2]})], store.now))
            for i in range(5)
        )
    )
    assert sorted(r[0] for r in results) == [False] * 4 + [True]
    assert len(await store.all_tasks()) == 1
    # and within one batch
    created = await store.insert(unique_task(store, "x1", {"q": 1}), unique_task(store, "x2", {"q": 1}))
    assert created == [True, False]


# -- TaskInfo of many ------------------------------------------------------------------------------


async def test_get_tasks_reads_many_keys_at_once(store: Store) -> None:
    for key in ("a", "b", "c"):
        await store.add(key)
    docs = await store.driver.get_tasks(["c", "missing", "a", "c"])
    assert sorted(doc["key"] for doc in docs) == ["a", "c"]
    assert await store.driver.get_tasks([]) == []


# -- plans and removed runs ------------------------------------------------------------------------


async def test_a_plan_whose_finished_run_was_removed_records_it_missing_and_goes_on(store: Store) -> None:
    """Retention may remove a plan's last run before a planner saw its outcome: the plan records
    it as ``missing`` (not a failure) and makes its next occurrence."""
    ops = Operations(store.driver, clock=store.clock)
    hour = timedelta(hours=1)
    timing = PlanTiming(schedule=EverySchedule(interval=hour, start=store.at(60)))
    await ops.add_plan(Plan(plan_id="p", name=NAME, timing=timing))
    planner = Planner(store.driver, clock=store.clock)
    store.advance(60)
    assert await planner.run_once() == 1
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.done(claimed, "w1")
    store.advance(120)
    service = RetentionService(store.driver, Retention(succeeded=timedelta(seconds=60)), clock=store.clock)
    assert await service.run_once() == 1  # removed before any planner looked at it
    await planner.run_once()
    plan = await ops.get_plan("p")
    assert plan.last_run_status == "missing" and plan.consecutive_failures == 0
    store.advance(3600 - 120)
    assert await planner.run_once() == 1  # the next occurrence, on time
    assert [doc["key"] for doc in await store.all_tasks()] == [(await ops.get_plan("p")).last_run_key]


async def test_a_mongo_store_keeps_one_partial_ttl_index_per_status(store: Store) -> None:
    """On MongoDB each terminal status with a period has a TTL index on ``state.finish_time``,
    partial on that status (and on tasks of no family); a changed period is changed in place
    (``collMod``), a period of None drops its index."""
    import inspect

    from mscheduler.drivers.mongo.driver import MongoDriver

    if not isinstance(store.driver, MongoDriver):
        pytest.skip("TTL indexes are MongoDB's")
    assert await store.driver.ensure_retention(RetentionParams(Retention().periods())) is True
    changed = Retention(succeeded=timedelta(hours=1), failed=None)
    assert await store.driver.ensure_retention(RetentionParams(changed.periods())) is True
    cursor = store.driver.tasks.list_indexes()
    cursor = await cursor if inspect.isawaitable(cursor) else cursor
    ttl = {ix["name"]: ix async for ix in cursor if ix["name"].startswith("retention_")}
    assert sorted(ttl) == ["retention_cancelled", "retention_expired", "retention_succeeded"]
    assert ttl["retention_succeeded"]["expireAfterSeconds"] == 3600
    assert ttl["retention_cancelled"]["expireAfterSeconds"] == 30 * 86_400
    partial = {"state.status": "succeeded", "solo": True}
    assert ttl["retention_succeeded"]["partialFilterExpression"] == partial
