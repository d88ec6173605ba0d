"""Task control (cancel, pause, resume, remove, restart): every status x every operation.

Each operation is one compare-and-set on the task's status: it is applied, or refused with
``TransitionRefused`` (naming the status and the rule) and nothing changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mscheduler import Operations, TaskStatus, TransitionRefused, UnknownTask
from mscheduler.drivers.base import ExpireParams
from tests.conformance.support import Store

STATUSES = ["pending", "running", "succeeded", "failed", "expired", "cancelled"]


async def make_task(store: Store, ops: Operations, status: str, key: str = "t") -> None:
    """A task ``key`` in ``status``."""
    if status == "expired":
        await store.add(key, deadline=store.at(5))
        store.advance(10)
        assert await store.driver.expire_deadlines(ExpireParams(store.now)) == 1
        await store.check_all()
    else:
        await store.add(key, max_unexpected_retries=0)
    if status in ("running", "succeeded", "failed"):
        claimed = await store.claim_one("w1")
        assert claimed is not None
        if status == "succeeded":
            assert await store.done(claimed, "w1", result=1)
        elif status == "failed":
            assert await store.fail(claimed, "w1")
    elif status == "cancelled":
        await ops.cancel(key, "no longer needed")
    assert await store.status(key) == status


def operations(store: Store) -> Operations:
    return Operations(store.driver, clock=store.clock)


# operation -> statuses it is allowed from (everything else is refused)
ALLOWED: dict[str, set[str]] = {
    "cancel": {"pending", "running"},
    "pause": {"pending", "running"},
    "resume": {"pending", "running"},
    "remove": {"pending", "succeeded", "failed", "expired", "cancelled"},
    "remove_force": set(STATUSES),
    "restart": {"failed", "expired", "cancelled"},
    "restart_force": {"failed", "expired", "cancelled", "succeeded"},
}


def call(ops: Operations, operation: str, key: str) -> Awaitable[Any]:
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "cancel": lambda: ops.cancel(key, "because"),
        "pause": lambda: ops.pause(key),
        "resume": lambda: ops.resume(key),
        "remove": lambda: ops.remove(key),
        "remove_force": lambda: ops.remove(key, force=True),
        "restart": lambda: ops.restart(key),
        "restart_force": lambda: ops.restart(key, force=True),
    }
    return calls[operation]()


def without_update_time(doc: dict[str, Any]) -> dict[str, Any]:
    return doc | {"state": {k: v for k, v in doc["state"].items() if k != "update_time"}}


@pytest.mark.parametrize("operation", sorted(ALLOWED))
@pytest.mark.parametrize("status", STATUSES)
async def test_operation_by_status(store: Store, status: str, operation: str) -> None:
    ops = operations(store)
    await make_task(store, ops, status)
    before = await store.get("t")
    store.advance(1)
    if status not in ALLOWED[operation]:
        with pytest.raises(TransitionRefused) as refused:
            await call(ops, operation, "t")
        assert refused.value.status == status
        assert status in str(refused.value) and refused.value.rule in str(refused.value)
        assert await store.get("t") == before  # nothing changed, not even the update time
        return
    await call(ops, operation, "t")
    await store.check_all()
    if operation.startswith("remove"):
        assert await store.driver.get_task("t") is None
        return
    state = await store.state("t")
    if operation == "cancel":
        assert state["status"] == "cancelled"
        assert state["cancelled"]["reason"] == "because"
        assert state["claim_at"] is None and state["claimers"] == []
        assert len(state["worker_states"]) == len(before["state"]["worker_states"])  # entries kept
    elif operation in ("pause", "resume"):
        assert state["status"] == status
        assert state["paused"] is (operation == "pause")
        if operation == "pause":
            assert state["claim_at"] is None and state["claimers"] == []
    else:  # restart: a new generation, the old attempts kept in the history
        assert state["status"] == "pending"
        assert state["worker_states"] == []
        assert state["generation"] == 1
        assert state["history"][0]["worker_states"] == before["state"]["worker_states"]
        assert state["claim_at"] is not None
        assert await store.claim_one("w1") is not None  # claimable again, with a fresh budget


@pytest.mark.parametrize("operation", sorted(ALLOWED))
async def test_unknown_key(store: Store, operation: str) -> None:
    with pytest.raises(UnknownTask):
        await call(operations(store), operation, "nope")


async def test_cancel_fences_the_running_attempt(store: Store) -> None:
    ops = operations(store)
    await store.add("t")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    info = await ops.cancel("t", "stop it")
    assert info.status is TaskStatus.CANCELLED and info.cancelled is not None
    assert info.cancelled["reason"] == "stop it"
    result = await store.ping("w1", {"t": claimed.attempt})
    assert result.cancelled == ["t"] and not result.alive and not result.lost
    assert not await store.done(claimed, "w1")  # the late finish is refused
    assert await store.status("t") == "cancelled"
    assert await store.claim_one("w2") is None


async def test_finish_first_then_cancel_is_refused(store: Store) -> None:
    ops = operations(store)
    await store.add("t")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.done(claimed, "w1", result=7)
    with pytest.raises(TransitionRefused, match="succeeded"):
        await ops.cancel("t")
    assert await store.status("t") == "succeeded"


async def test_pause_stops_claims_and_resume_restores_them(store: Store) -> None:
    ops = operations(store)
    await store.add("t")
    info = await ops.pause("t")
    assert info.paused and info.status is TaskStatus.PENDING
    assert await store.claim_one("w1") is None
    info = await ops.resume("t")
    assert not info.paused
    assert await store.claim_one("w1") is not None


async def test_paused_running_attempt_runs_on(store: Store) -> None:
    ops = operations(store)
    await store.add("t")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    await ops.pause("t")
    assert (await store.ping("w1", {"t": claimed.attempt})).alive
    assert await store.done(claimed, "w1")
    assert await store.status("t") == "succeeded"


async def test_restart_resets_the_budget(store: Store) -> None:
    ops = operations(store)
    await store.add("t", max_unexpected_retries=0)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.fail(claimed, "w1", retry_in=0)
    assert await store.status("t") == "failed"
    info = await ops.restart("t")
    assert info.status is TaskStatus.PENDING and info.fail_cnt == 0
    again = await store.claim_one("w1")
    assert again is not None and again.fail_cnt == 0
    # the first generation's attempt is fenced out: it is no longer among the entries
    assert not await store.done(claimed, "w1")
    assert await store.fail(again, "w1", retry_in=0)
    assert await store.status("t") == "failed"
    info = await ops.restart("t")
    state = await store.state("t")
    assert state["generation"] == 2 and len(state["history"]) == 2


async def test_restart_of_expired_drops_the_past_deadline(store: Store) -> None:
    ops = operations(store)
    await make_task(store, ops, "expired")
    await ops.restart("t")
    assert (await store.get("t"))["option"]["deadline"] is None
    assert await store.claim_one("w1") is not None


async def test_remove_force_cancels_a_running_task_first(store: Store) -> None:
    ops = operations(store)
    await store.add("t")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    await ops.remove("t", force=True)
    assert await store.driver.get_task("t") is None
    assert (await store.ping("w1", {"t": claimed.attempt})).lost == ["t"]
    assert await store.add("t")  # the key can be used again
    store.advance(1)
    assert await store.claim_one("w2") is not None
