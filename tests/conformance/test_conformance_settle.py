"""Attempts told to stop are settled, and never twice at once across generations (issue 17 A1, A2).

* A cancel settles the running attempt as ``cancelled`` — written fenced by its worker once the
  handler stopped, or by the lease pass at the lease's end when the holder is gone — never
  ``lost``, never counted as a failure, no ``lease_lost`` event. A stopping pause settles it as
  ``released`` (error ``Paused``) the same way.
* No restart, reset or resume makes a task claimable while an attempt of any generation holds a
  live lease: a restart (and ``send(reset_finished=True)``) is refused while one does
  (``TransitionRefused`` naming it); entries whose holders are gone are settled first, so no
  running entry ever moves to ``state.history``; and the lease pass settles running entries there
  too (stores of earlier builds have them).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Operations, TaskStatus, TransitionRefused
from mscheduler.drivers.base import EventQuery, InsertParams, paused_error
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.common import to_mongo
from tests.conformance.support import Store

LEASE = timedelta(seconds=30)
CANCELLED = {"type": "Cancelled", "message": "the task was cancelled", "traceback": None}


def cancelled_error() -> dict[str, Any]:
    """The error of an attempt settled ``cancelled`` (drivers.base.cancelled_error)."""
    return dict(CANCELLED)


def operations(store: Store) -> Operations:
    return Operations(store.driver, clock=store.clock)


async def running(store: Store, key: str = "t", **option: Any) -> str:
    """A task ``key`` with one running attempt of w1; returns its attempt token."""
    assert await store.add(key, **option)
    claimed = await store.claim_one("w1")
    assert claimed is not None and claimed.key == key
    return claimed.attempt


# -- A1: a cancel settles the attempt --------------------------------------------------------------


async def test_a_release_refused_by_a_cancel_settles_the_attempt_cancelled(store: Store) -> None:
    """A worker stopping gracefully releases its attempts; on a cancelled task the release is
    refused and the attempt is settled ``cancelled`` (its handler has stopped)."""
    attempt = await running(store, max_unexpected_retries=0)
    await operations(store).cancel("t", "no longer needed")
    store.advance(1)
    assert not await store.finish("t", "w1", attempt, "released", error=paused_error())
    state = await store.state("t")
    assert state["status"] == "cancelled" and state["running_cnt"] == 0 and state["fail_cnt"] == 0
    entry = await store.entry("t", attempt)
    assert entry["status"] == "cancelled" and entry["error"] == cancelled_error()
    assert entry["end_time"] == store.now and entry["retry_at"] is None


async def test_the_worker_settles_cancelled_with_a_fenced_write(store: Store) -> None:
    attempt = await running(store)
    await operations(store).cancel("t")
    assert await store.finish("t", "w2", attempt, "cancelled", error=cancelled_error()) is False  # not its
    assert await store.finish("t", "w1", attempt, "cancelled", error=cancelled_error())
    assert (await store.entry("t", attempt))["status"] == "cancelled"
    # a settlement is an outcome like any other: the same one sent again is accepted, nothing more
    assert await store.finish("t", "w1", attempt, "cancelled", error=cancelled_error())
    assert await store.status("t") == "cancelled"


async def test_an_outcome_refused_by_a_cancel_settles_the_attempt_cancelled(store: Store) -> None:
    attempt = await running(store)
    await operations(store).cancel("t")
    store.advance(1)
    assert not await store.finish("t", "w1", attempt, "succeeded", result=1)  # the cancel won
    entry = await store.entry("t", attempt)
    assert entry["status"] == "cancelled" and entry["result"] is None and entry["end_time"] == store.now
    state = await store.state("t")
    assert state["status"] == "cancelled" and state["success_cnt"] == 0 and state["fail_cnt"] == 0


async def test_a_task_that_was_not_cancelled_takes_no_cancelled_settlement(store: Store) -> None:
    attempt = await running(store)
    assert not await store.finish("t", "w1", attempt, "cancelled", error=cancelled_error())
    assert (await store.entry("t", attempt))["status"] == "running"


async def test_the_lease_pass_settles_a_cancelled_attempt_cancelled_not_lost(store: Store) -> None:
    store.driver.record_events = True
    await store.driver.setup()
    attempt = await running(store, max_unexpected_retries=0)
    await operations(store).cancel("t")
    store.advance(LEASE.total_seconds())  # the holder is gone: its lease runs out
    assert await store.expire() == 1
    entry = await store.entry("t", attempt)
    assert entry["status"] == "cancelled" and entry["error"] == cancelled_error()
    assert entry["retry_at"] is None
    state = await store.state("t")
    assert state["status"] == "cancelled" and state["fail_cnt"] == 0 and state["running_cnt"] == 0
    kinds = [e["kind"] for e in await store.driver.list_events(EventQuery(keys=["t"], limit=100))]
    assert "lease_lost" not in kinds and "cancelled" in kinds


async def test_the_lease_pass_settles_a_pause_stopped_attempt_released(store: Store) -> None:
    attempt = await running(store, max_unexpected_retries=0)
    other = await running(store, "u", max_unexpected_retries=0)
    await operations(store).pause("t", stop_running=True)
    store.advance(LEASE.total_seconds())
    assert await store.expire() == 2
    entry = await store.entry("t", attempt)
    assert entry["status"] == "released" and entry["error"] == paused_error()
    assert (await store.state("t"))["fail_cnt"] == 0  # the budget (0) is intact for the resume
    assert (await store.entry("u", other))["status"] == "lost"  # no stop: a real loss


# -- A2: never twice at once across generations ------------------------------------------------------


async def test_restart_is_refused_while_an_attempt_holds_a_live_lease(store: Store) -> None:
    ops = operations(store)
    attempt = await running(store)
    await ops.cancel("t")
    before = await store.get("t")
    store.advance(1)
    with pytest.raises(TransitionRefused) as refused:
        await ops.restart("t")
    assert refused.value.status == "cancelled"
    assert attempt in refused.value.rule and "w1" in refused.value.rule and "live lease" in refused.value.rule
    assert await store.get("t") == before  # nothing changed
    assert await store.claim_one("w2") is None
    # once the worker settled the stopped attempt, the restart goes through
    assert await store.finish("t", "w1", attempt, "cancelled", error=cancelled_error())
    info = await ops.restart("t")
    assert info.status is TaskStatus.PENDING
    assert await store.claim_one("w2") is not None


async def test_restart_settles_attempts_whose_holders_are_gone(store: Store) -> None:
    ops = operations(store)
    attempt = await running(store, max_unexpected_retries=0)
    await ops.cancel("t")
    store.advance(LEASE.total_seconds())  # the lease ended; no lease pass ran since
    info = await ops.restart("t")
    assert info.status is TaskStatus.PENDING
    state = await store.state("t")
    (old,) = state["history"][0]["worker_states"]
    assert old["attempt"] == attempt and old["status"] == "cancelled"  # never running in the history
    assert await store.claim_one("w2") is not None


async def test_a_force_restart_of_a_succeeded_task_waits_for_its_running_attempt(store: Store) -> None:
    """An edit can leave a succeeded task with a running attempt (fewer slots than runs)."""
    ops = operations(store)
    assert await store.add("t", concurrent_worker_cnt=2)
    first = await store.claim_one("w1")
    second = await store.claim_one("w2")
    assert first is not None and second is not None
    await store.change_option("t", concurrent_worker_cnt=1)
    assert await store.done(first, "w1")
    assert await store.status("t") == "succeeded"
    with pytest.raises(TransitionRefused, match=second.attempt):
        await ops.restart("t", force=True)
    # a re-send with reset_finished does not drop it either: reported as not reset
    task = store.task("t", concurrent_worker_cnt=1)
    assert await store.driver.insert_tasks(InsertParams([task], store.now, reset_finished=True)) == [False]
    assert await store.status("t") == "succeeded"
    assert (await store.entry("t", second.attempt))["status"] == "running"
    assert await store.done(second, "w2")
    assert await store.driver.insert_tasks(InsertParams([task], store.now, reset_finished=True)) == [True]


async def test_resume_after_a_stopping_pause_claims_nothing_beside_the_running_attempt(
    store: Store,
) -> None:
    ops = operations(store)
    attempt = await running(store)
    await ops.pause("t", stop_running=True)
    await ops.resume("t")
    assert await store.claim_one("w2") is None  # the stopped attempt still holds the slot
    assert await store.finish("t", "w1", attempt, "released", error=paused_error())
    assert await store.claim_one("w2") is not None


async def _legacy_restart(store: Store, key: str) -> None:
    """What a restart of an earlier build did: the running entries moved to ``state.history``."""
    doc = await store.get(key)
    history = [{"generation": 0, "restart_time": store.now, "worker_states": doc["state"]["worker_states"]}]
    if isinstance(store.driver, MemoryDriver):
        store.driver._tasks[key]["state"].update(history=history, worker_states=[], generation=1)
        return
    mongo: Any = store.driver
    fields = {"state.history": history, "state.worker_states": [], "state.generation": 1}
    await mongo.tasks.update_one({"_id": key}, {"$set": to_mongo(fields)})


async def test_the_lease_pass_settles_running_entries_of_earlier_generations(store: Store) -> None:
    attempt = await running(store)
    await _legacy_restart(store, "t")
    ops = operations(store)
    await ops.cancel("t")
    with pytest.raises(TransitionRefused, match=attempt):  # a live lease in the history counts too
        await ops.restart("t")
    store.advance(LEASE.total_seconds() - 1)
    await store.expire()
    assert (await store.state("t"))["history"][0]["worker_states"][0]["status"] == "running"  # live
    store.advance(1)
    assert await store.expire() == 1
    (entry,) = (await store.state("t"))["history"][0]["worker_states"]
    assert entry["attempt"] == attempt and entry["status"] == "lost" and entry["end_time"] == store.now
    assert await store.expire() == 0  # settled once
    assert (await ops.restart("t")).status is TaskStatus.PENDING
