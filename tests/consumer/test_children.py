"""Child tasks with consumers (SPEC F15): order, parallel mode, a child failing for good, a crash
mid-child, the operators' child controls and the reconciler that repairs a missed sync."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    Child,
    Fail,
    InvalidInput,
    Operations,
    Task,
    TaskCancelled,
    TaskContext,
    TaskFailed,
    TaskOption,
    TaskStatus,
    TransitionRefused,
)
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.services.children import ChildSync
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from tests.consumer.support import FreezableDriver, Gate, Harness, settle
from tests.helpers import as_driver

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=5),
    retry_delay=timedelta(seconds=1),
    max_unexpected_retries=1,
)
STEPS = ["fetch", "transform", "load"]


async def until(harness: Harness, done: Callable[[], Awaitable[bool]], limit: int = 60) -> None:
    """Advance the fake clock a second at a time (polls, reconciler passes) until ``done()``."""
    for _ in range(limit):
        if await done():
            return
        await harness.advance(1.0)
    raise AssertionError(f"not done after {limit} fake seconds")


def status_is(harness: Harness, key: str, status: TaskStatus) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await harness.get(key)).status is status

    return check


class Steps:
    """Handlers for the steps that log when each starts and ends; ``hold`` makes one wait on a
    gate, ``fail`` makes one raise ``Fail`` (no retry) while the name is in it."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.gates: dict[str, Gate] = {}
        self.fail: set[str] = set()

    def hold(self, name: str) -> Gate:
        self.gates[name] = Gate()
        return self.gates[name]

    def handlers(self, names: list[str] = STEPS) -> dict[str, Any]:
        def make(name: str) -> Any:
            async def step(params: Any, ctx: TaskContext) -> str:
                self.log.append(f"start {name}")
                if name in self.gates:
                    await self.gates[name].wait()
                if name in self.fail:
                    self.log.append(f"fail {name}")
                    raise Fail(f"{name} cannot go on")
                self.log.append(f"end {name}")
                return f"{name} by {ctx.worker_id} with {params}"

            return step

        return {name: make(name) for name in names}


def etl(mode: str | None = None, children: Any = STEPS) -> Task:
    return Task("etl", "etl", {"day": 1}, option=OPTION, children=children, children_mode=mode)


async def test_children_run_in_order_and_wait_returns_their_results(harness: Harness) -> None:
    steps = Steps()
    w1 = harness.consumer("w1", steps.handlers(), concurrency=3)
    await harness.start(w1)
    assert await harness.publisher.send(etl())
    assert not await harness.publisher.send(etl())  # idempotent: the family exists
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))
    assert steps.log == [f"{edge} {name}" for name in STEPS for edge in ("start", "end")]
    results = await harness.publisher.wait("etl", timeout=1)
    assert results == {name: f"{name} by w1 with {{'day': 1}}" for name in STEPS}
    parent = await harness.get("etl")
    assert [(c.name, c.status.value) for c in parent.children or []] == [(n, "succeeded") for n in STEPS]
    assert parent.children_mode == "sequential" and parent.worker_states == []


async def test_a_later_child_waits_while_the_one_before_it_runs(harness: Harness) -> None:
    steps = Steps()
    gate = steps.hold("fetch")
    w1 = harness.consumer("w1", steps.handlers(), concurrency=3)
    await harness.start(w1)
    await harness.publisher.send(etl())
    await until(harness, lambda: _true(gate.waiting == 1))
    await until(harness, status_is(harness, "etl", TaskStatus.RUNNING))
    await harness.advance(3.0)
    assert steps.log == ["start fetch"]  # transform is blocked while fetch runs
    assert (await harness.get("etl/transform")).blocked
    gate.open()
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))
    assert steps.log.index("end fetch") < steps.log.index("start transform") < steps.log.index("start load")


async def _true(value: bool) -> bool:
    return value


async def test_parallel_children_run_at_once_on_several_workers(harness: Harness) -> None:
    steps = Steps()
    gates = [steps.hold(name) for name in STEPS]
    workers = [harness.consumer(f"w{i}", steps.handlers(), concurrency=1) for i in range(3)]
    await harness.start(*workers)
    await harness.publisher.send(etl("parallel"))
    await until(harness, lambda: _true(sum(g.waiting for g in gates) == 3))
    assert {w for w, _ in harness.recorder.of("claimed")} == {"w0", "w1", "w2"}
    await until(harness, status_is(harness, "etl", TaskStatus.RUNNING))
    for gate in gates:
        gate.open()
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))
    assert set(await harness.publisher.wait("etl", timeout=1)) == set(STEPS)


async def test_a_child_failing_for_good_fails_the_parent_and_the_rest_never_runs(harness: Harness) -> None:
    steps = Steps()
    steps.fail.add("transform")
    w1 = harness.consumer("w1", steps.handlers(), concurrency=3)
    await harness.start(w1)
    await harness.publisher.send(etl())
    await until(harness, status_is(harness, "etl", TaskStatus.FAILED))
    await harness.advance(10.0)
    assert steps.log == ["start fetch", "end fetch", "start transform", "fail transform"]
    parent = await harness.get("etl")
    assert [c.status.value for c in parent.children or []] == ["succeeded", "failed", "pending"]
    with pytest.raises(TaskFailed, match=r"child 'transform'.*transform cannot go on"):
        await harness.publisher.wait("etl", timeout=1)


async def test_a_crash_mid_child_reruns_that_child_only(harness: Harness) -> None:
    steps = Steps()
    gate = steps.hold("transform")
    a = harness.consumer(
        "A", steps.handlers(), driver=as_driver(FaultyDriver(harness.new_driver())), concurrency=3
    )
    b_driver = FreezableDriver(harness.new_driver())
    b_driver.freeze("claim")  # B is up, but claims nothing until A has crashed
    b = harness.consumer("B", steps.handlers(), driver=b_driver, concurrency=3)
    await harness.start(a, b)
    await harness.publisher.send(etl())
    await until(harness, lambda: _true(gate.waiting == 1))
    await harness.advance(1.0)  # A pings: its lease is the task's worker_timeout
    await crash_consumer(a)
    harness.consumers.remove(a)  # dead: nothing to stop
    del steps.gates["transform"]  # the next run of transform does not wait
    b_driver.thaw("claim")
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))
    assert steps.log == [
        "start fetch",
        "end fetch",
        "start transform",
        "start transform",
        "end transform",
        "start load",
        "end load",
    ]
    fetch, transform = await harness.get("etl/fetch"), await harness.get("etl/transform")
    assert [(w.worker_id, w.status.value) for w in fetch.worker_states] == [("A", "succeeded")]
    assert [(w.worker_id, w.status.value) for w in transform.worker_states] == [
        ("A", "lost"),
        ("B", "succeeded"),
    ]


async def test_restart_child_after_it_failed_for_good_lets_the_parent_succeed(harness: Harness) -> None:
    steps = Steps()
    steps.fail.add("transform")
    w1 = harness.consumer("w1", steps.handlers(), concurrency=3)
    await harness.start(w1)
    await harness.publisher.send(etl())
    await until(harness, status_is(harness, "etl", TaskStatus.FAILED))
    ops = Operations(harness.driver, clock=harness.clock)
    steps.fail.clear()
    child = await ops.restart_child("etl", "transform")
    assert child.key == "etl/transform" and child.status is TaskStatus.PENDING
    assert (await harness.get("etl")).status is TaskStatus.PENDING  # re-derived from its children
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))
    assert steps.log.count("start fetch") == 1 and steps.log.count("start transform") == 2
    with pytest.raises(TransitionRefused, match="succeeded"):
        await ops.restart_child("etl", "fetch")


async def test_a_step_set_done_by_hand_starts_the_next_one(harness: Harness) -> None:
    steps = Steps()
    steps.fail.add("transform")
    w1 = harness.consumer("w1", steps.handlers(), concurrency=3)
    await harness.start(w1)
    await harness.publisher.send(etl())
    await until(harness, status_is(harness, "etl", TaskStatus.FAILED))
    ops = Operations(harness.driver, clock=harness.clock)
    child = await ops.set_child_status("etl", "transform", "succeeded", reason="fixed by hand", by="ana")
    assert child.status is TaskStatus.SUCCEEDED
    assert child.marked is not None and (child.marked["by"], child.marked["reason"]) == (
        "ana",
        "fixed by hand",
    )
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))
    assert steps.log[-2:] == ["start load", "end load"]
    results = await harness.publisher.wait("etl", timeout=1)
    assert results["transform"] is None and results["load"].startswith("load by w1")


async def test_a_running_child_cannot_be_set_by_hand(harness: Harness) -> None:
    steps = Steps()
    gate = steps.hold("fetch")
    w1 = harness.consumer("w1", steps.handlers(), concurrency=3)
    await harness.start(w1)
    await harness.publisher.send(etl())
    await until(harness, lambda: _true(gate.waiting == 1))
    ops = Operations(harness.driver, clock=harness.clock)
    with pytest.raises(TransitionRefused, match="running"):
        await ops.set_child_status("etl", "fetch", "succeeded")
    before = await harness.get("etl/fetch")
    assert before.marked is None and before.status is TaskStatus.RUNNING
    gate.open()


async def test_cancelling_the_parent_cancels_its_unfinished_children(harness: Harness) -> None:
    steps = Steps()
    gate = steps.hold("fetch")
    cancelled: list[str] = []
    handlers = steps.handlers()
    inner = handlers["fetch"]

    async def fetch(params: Any, ctx: TaskContext) -> str:
        try:
            return str(await inner(params, ctx))
        except asyncio.CancelledError:
            cancelled.append(ctx.key)
            raise

    handlers["fetch"] = fetch
    w1 = harness.consumer("w1", handlers, concurrency=3)
    await harness.start(w1)
    await harness.publisher.send(etl())
    await until(harness, lambda: _true(gate.waiting == 1))
    ops = Operations(harness.driver, clock=harness.clock)
    parent = await ops.cancel("etl", "not today")
    assert parent.status is TaskStatus.CANCELLED
    assert [c.status.value for c in parent.children or []] == ["cancelled"] * 3
    await until(harness, lambda: _true(cancelled == ["etl/fetch"]))
    with pytest.raises(TaskCancelled, match="not today"):
        await harness.publisher.wait("etl", timeout=1)
    restarted = await ops.restart("etl")  # the cancelled children run again, in order
    assert restarted.status is TaskStatus.PENDING
    gate.open()
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED))


async def _finish_fetch_without_sync(harness: Harness) -> None:
    """A worker claims and finishes ``etl/fetch``, then dies before it syncs the parent."""
    now = harness.clock.now()
    (claimed,) = await harness.driver.claim(ClaimParams("gone", ["fetch"], now, ["t1"]))
    assert await harness.driver.finish([FinishParams(claimed.key, "gone", "t1", now, "succeeded", "ok")])
    assert [c.status.value for c in (await harness.get("etl")).children or []] == ["pending", "pending"]


async def test_a_reconciler_pass_repairs_a_parent_whose_sync_was_missed(harness: Harness) -> None:
    await harness.publisher.send(etl(children=["fetch", "load"]))
    await _finish_fetch_without_sync(harness)
    sync = ChildSync(harness.driver, clock=harness.clock)
    assert await sync.run_once() == 1
    assert await sync.run_once() == 0
    assert [c.status.value for c in (await harness.get("etl")).children or []] == ["succeeded", "pending"]
    assert not (await harness.get("etl/load")).blocked


async def test_a_consumers_reconciler_repairs_a_missed_sync(harness: Harness) -> None:
    steps = Steps()
    w1 = harness.consumer("w1", steps.handlers(["load"]), children_interval=2.0)
    await harness.start(w1)
    await harness.publisher.send(etl(children=["fetch", "load"]))
    await _finish_fetch_without_sync(harness)
    await until(harness, status_is(harness, "etl", TaskStatus.SUCCEEDED), limit=10)
    assert steps.log == ["start load", "end load"]


async def test_bad_input_is_refused_and_changes_nothing(harness: Harness, caplog: Any) -> None:
    with pytest.raises(InvalidInput, match="duplicate child names"):
        Task("t", "etl", children=["a", "a"])
    with pytest.raises(InvalidInput, match="at least 1"):
        Task("t", "etl", children=[])
    with pytest.raises(InvalidInput, match=re.escape("invalid task name: 1-200")):
        Task("t", "etl", children=["a|b"])
    with pytest.raises(InvalidInput, match="children_mode needs children"):
        Task("t", "etl", children_mode="parallel")
    with pytest.raises(InvalidInput, match="reset_finished"):
        await harness.publisher.send(etl(), reset_finished=True)
    assert await harness.driver.get_task("etl") is None

    with caplog.at_level(logging.WARNING, logger="mscheduler.publisher"):
        await harness.publisher.send(Task("odd", "etl", children=["nobody_runs_this", Child("nor_this")]))
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "'nobody_runs_this'" in warned and "'nor_this'" in warned and "'etl'" not in warned

    ops = Operations(harness.driver, clock=harness.clock)
    await harness.publisher.send(Task("plain", "work"))
    with pytest.raises(InvalidInput, match=r"no child named 'nope'.*'nobody_runs_this', 'nor_this'"):
        await ops.restart_child("odd", "nope")
    with pytest.raises(InvalidInput, match="has no children"):
        await ops.set_child_status("plain", "work", "succeeded")
    with pytest.raises(InvalidInput, match="status: one of"):
        await ops.set_child_status("odd", "nor_this", "running")
    with pytest.raises(TransitionRefused, match="removed with its parent"):
        await ops.remove("odd/nor_this")
    with pytest.raises(TransitionRefused, match="takes its status from them"):
        await ops.set_status("odd", "succeeded")
    assert (await harness.get("odd")).status is TaskStatus.PENDING
    await ops.remove("odd")  # with its children
    assert await harness.driver.get_task("odd/nor_this") is None


async def test_a_plain_task_set_succeeded_by_hand_is_waited_for(harness: Harness) -> None:
    await harness.publisher.send(Task("plain", "work"))
    ops = Operations(harness.driver, clock=harness.clock)
    info = await ops.set_status("plain", "succeeded", reason="done elsewhere")
    assert info.status is TaskStatus.SUCCEEDED and info.claim_at is None
    assert await harness.publisher.wait("plain", timeout=1) is None
    restarted = await ops.restart("plain", force=True)
    assert restarted.status is TaskStatus.PENDING and restarted.marked is None
    await settle()


async def test_send_many_keeps_each_family_in_one_insert(harness: Harness, monkeypatch: Any) -> None:
    import mscheduler.publishing as publishing

    monkeypatch.setattr(publishing, "SEND_MANY_BATCH", 4)
    inserts: list[list[str]] = []
    insert = harness.driver.insert_tasks

    async def recording(params: Any) -> list[bool]:
        inserts.append([t.key for t in params.tasks])
        return await insert(params)

    monkeypatch.setattr(harness.driver, "insert_tasks", recording)
    tasks = [Task(f"f{i}", "etl", children=["a", "b"]) for i in range(3)] + [Task("plain", "work")]
    assert await harness.publisher.send_many(tasks) == [True, True, True, True]
    assert inserts == [["f0", "f0/a", "f0/b"], ["f1", "f1/a", "f1/b"], ["f2", "f2/a", "f2/b", "plain"]]
    assert await harness.publisher.send_many(tasks[:1]) == [False]
    with pytest.raises(InvalidInput, match="twice"):
        await harness.publisher.send_many(
            [Task("x", "etl", children=["a"]), Task("x", "etl", children=["b"])]
        )
    with pytest.raises(InvalidInput, match="child tasks'"):  # a child's key is made with its parent only
        await harness.publisher.send_many([Task("x", "etl", children=["a"]), Task("x/a", "work")])
