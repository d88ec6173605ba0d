"""Task control (cancel, pause, resume, remove, restart): every status x every operation.

Each operation is one compare-and-set on the task's status: it is applied, or refused with
``TransitionRefused`` (naming the status and the rule) and nothing changes.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mscheduler import AttemptStatus, Operations, TaskInfo, TaskStatus, TransitionRefused, UnknownTask
from mscheduler.drivers.base import MAX_HISTORY, ControlParams, ExpireParams, paused_error
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
    "pause_stop": {"pending", "running"},
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
        "pause_stop": lambda: ops.pause(key, stop_running=True),
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
    before_entries = before["state"]["worker_states"]
    running = [e["attempt"] for e in before_entries if e["status"] == "running"]
    if operation == "cancel":
        assert state["status"] == "cancelled"
        assert state["cancelled"]["reason"] == "because"
        assert state["claim_at"] is None and state["claimers"] == []
        assert state["worker_states"] == before_entries  # entries kept (fenced by the flag)
        # the running attempts are told to stop (the change stream passes state.stop)
        expected_stop = {"action": "cancel", "time": store.now, "attempts": running} if running else None
        assert state.get("stop") == expected_stop
    elif operation == "pause_stop":
        # one write: paused, the running attempt told to stop; it keeps its entry (and slot) until
        # its worker settles it released (not counted) once its handler stopped
        assert state["paused"] is True
        assert state["status"] == status and state["claim_at"] is None and state["claimers"] == []
        assert state["worker_states"] == before_entries
        expected_stop = {"action": "pause", "time": store.now, "attempts": running} if running else None
        assert state.get("stop") == expected_stop
        for attempt in running:
            assert await store.finish("t", "w1", attempt, "released", error=paused_error())
        state = await store.state("t")
        assert state["status"] == "pending" and state["fail_cnt"] == before["state"]["fail_cnt"]
        assert [e["status"] for e in state["worker_states"]] == ["released"] * len(running)
        for entry in state["worker_states"]:
            assert entry["end_time"] == store.now
            assert entry["error"] == paused_error()
        resumed = await ops.resume("t")
        assert resumed.status is TaskStatus.PENDING and resumed.fail_cnt == 0
        assert (await store.state("t")).get("stop") is None
        again = await store.claim_one("w2")  # claimable again, the budget (0 retries) intact
        assert again is not None and again.fail_cnt == 0
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


async def test_a_task_restarted_for_ever_keeps_its_last_generations_only(store: Store) -> None:
    """18.8: ``state.history`` grew with every restart (a task restarted by a nightly job would
    pass 16 MiB one day); it keeps the last ``MAX_HISTORY`` generations."""
    ops = operations(store)
    await store.add("t", max_unexpected_retries=0)
    for _ in range(MAX_HISTORY + 5):
        claimed = await store.claim_one("w1")
        assert claimed is not None
        assert await store.fail(claimed, "w1", retry_in=0)
        await ops.restart("t")
    state = await store.state("t")
    assert state["generation"] == MAX_HISTORY + 5
    assert [h["generation"] for h in state["history"]] == list(range(5, MAX_HISTORY + 5))


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


async def test_pause_stop_fences_the_running_attempt_and_keeps_the_budget(store: Store) -> None:
    ops = operations(store)
    await store.add("t", max_unexpected_retries=0)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    info = await ops.pause("t", stop_running=True)
    # told to stop; the attempt keeps its entry (and slot) until it is settled
    assert info.status is TaskStatus.RUNNING and info.paused
    assert [w.status for w in info.worker_states] == [AttemptStatus.RUNNING]
    result = await store.ping("w1", {"t": claimed.attempt})
    assert result.paused == ["t"] and not result.lost and not result.alive and not result.cancelled
    assert await store.claim_one("w2") is None  # paused
    await ops.resume("t")  # before the worker settled it: its running attempt still holds the slot
    assert await store.claim_one("w2") is None  # never twice at once
    await ops.pause("t", stop_running=True)
    assert not await store.done(claimed, "w1")  # its late outcome is refused; the attempt settles
    entries = await store.entries("t")
    assert [e["status"] for e in entries] == ["released"] and entries[0]["error"] == paused_error()
    await ops.resume("t")
    again = await store.claim_one("w2")
    assert again is not None and again.fail_cnt == 0
    # stopped by a pause again, settled by its worker: still within a budget of no failures at all
    await ops.pause("t", stop_running=True)
    assert await store.finish("t", "w2", again.attempt, "released", error=paused_error())
    await ops.resume("t")
    third = await store.claim_one("w1")
    assert third is not None and third.fail_cnt == 0
    assert await store.done(third, "w1")
    assert await store.status("t") == "succeeded"
    statuses = [e["status"] for e in await store.entries("t")]
    assert statuses == ["released", "released", "succeeded"]


WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="?")


class Linearized:
    """Records each control compare-and-set with who made it and the status it met: (who,
    action, allowed statuses, status before, applied). A few loop turns before each (seeded)
    shuffle the interleaving; a lock makes the read and the write one step even where the store
    really waits (a server)."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner = inner
        self.rng = random.Random(seed)
        self.log: list[tuple[str, str, tuple[str, ...], str | None, bool]] = []
        self._lock = asyncio.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get_task(self, key: str) -> Any:
        for _ in range(self.rng.randrange(3)):
            await asyncio.sleep(0)
        return await self.inner.get_task(key)

    async def control_task(self, params: ControlParams) -> dict[str, Any] | None:
        for _ in range(self.rng.randrange(4)):
            await asyncio.sleep(0)
        async with self._lock:
            doc = await self.inner.get_task(params.key)
            after: dict[str, Any] | None = await self.inner.control_task(params)
        before = doc["state"]["status"] if doc is not None else None
        # a restart also waits for every attempt holding a live lease (never twice at once)
        if doc is not None and params.action == "restart" and _live(doc, params.now):
            before = "live attempt"
        self.log.append((WHO.get(), params.action, tuple(params.statuses), before, after is not None))
        return after


def _live(doc: dict[str, Any], now: Any) -> bool:
    """An attempt of the task holds a live lease at ``now``."""
    entries = doc["state"]["worker_states"]
    return any(e["status"] == "running" and e["ping_expire_time"] > now for e in entries)


# the status after each action ("pause" stops the running attempt, which keeps its slot, and its
# status, until its worker settles it)
AFTER = {"cancel": "cancelled", "pause": "running", "restart": "pending", "remove": None}
RACERS: dict[str, Callable[[Operations], Awaitable[Any]]] = {
    "cancel": lambda ops: ops.cancel("t", "first"),
    "cancel again": lambda ops: ops.cancel("t", "second"),
    "pause": lambda ops: ops.pause("t", stop_running=True),
    "restart": lambda ops: ops.restart("t"),
    "remove": lambda ops: ops.remove("t"),
}


@pytest.mark.parametrize("seed", range(12))
async def test_racing_operations_on_one_key_are_decided_by_the_store(store: Store, seed: int) -> None:
    """Cancel, cancel again, pause (stopping), restart and remove at once on one running task:
    each is applied whole or refused (TransitionRefused / UnknownTask), as the compare-and-set
    on the status it met decides; replaying the applied ones gives the final state."""
    await store.add("t")
    assert await store.claim_one("w1") is not None
    driver = Linearized(store.driver, seed)
    order = list(RACERS)
    random.Random(seed).shuffle(order)

    async def race(name: str) -> Any:
        WHO.set(name)  # this task's own context
        return await RACERS[name](Operations(driver, clock=store.clock))

    results = await asyncio.gather(*(race(name) for name in order), return_exceptions=True)
    outcomes = dict(zip(order, results, strict=True))
    # every compare-and-set was decided by the status it met, and the applied ones chain
    status: str | None = "running"
    applied: list[str] = []
    for who, action, statuses, before, ok in driver.log:
        assert ok == (before in statuses), driver.log
        if ok:
            assert before == status, driver.log
            status = AFTER[action]
            applied.append(who)
    doc = await store.driver.get_task("t")
    assert (doc["state"]["status"] if doc is not None else None) == status
    await store.check_all()
    # what each caller was told agrees with what the store did
    for name, outcome in outcomes.items():
        if name not in applied:
            assert isinstance(outcome, (TransitionRefused, UnknownTask)), (name, outcome)
        elif isinstance(outcome, Exception):
            # applied, then removed before the caller's read-back of the result
            assert isinstance(outcome, UnknownTask), (name, outcome)
            assert applied[-1] == "remove" and doc is None, (name, outcome)
        else:
            assert outcome is None or isinstance(outcome, TaskInfo)
    assert len(applied) == len(set(applied))  # each at most once
    if "cancel" in applied and "cancel again" in applied:  # only with a restart in between
        first, second = sorted((applied.index("cancel"), applied.index("cancel again")))
        assert "restart" in applied[first:second]
    if doc is not None and doc["state"]["status"] == "cancelled":
        assert doc["state"]["cancelled"]["reason"] in ("first", "second")
