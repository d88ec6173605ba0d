"""Task control as consumers see it: cancel reaches a running handler at its next ping and fences
its finish; the cancel / finish race has one winner; pause stops claims, resume restores them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    AttemptStatus,
    Operations,
    Task,
    TaskCancelled,
    TaskContext,
    TaskOption,
    TaskStatus,
    TransitionRefused,
)
from tests.consumer.support import FreezableDriver, Gate, Harness, NoStreamDriver
from tests.helpers import wait_until

OPTION = TaskOption(ping_interval=timedelta(seconds=2), worker_timeout=timedelta(seconds=20))


def _handler(gate: Gate, cancelled: list[str]) -> Any:
    async def work(params: Any, ctx: TaskContext) -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.worker_id)
            raise
        return "done"

    return work


async def _running(harness: Harness, gate: Gate, cancelled: list[str], driver: Any = None) -> Operations:
    w1 = harness.consumer("w1", {"work": _handler(gate, cancelled)}, driver=driver)
    await harness.start(w1)
    assert await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    return Operations(harness.driver, clock=harness.clock)


async def test_cancel_reaches_the_handler_at_its_next_ping(harness: Harness) -> None:
    """Without a change stream (see test_stop_and_checkpoints for the stream)."""
    gate, cancelled = Gate(), list[str]()
    ops = await _running(harness, gate, cancelled, driver=NoStreamDriver(harness.new_driver()))
    info = await ops.cancel("t", "operator said so")
    assert info.status is TaskStatus.CANCELLED
    assert cancelled == []  # the handler learns at its next ping
    await harness.advance(2.0)
    await harness.recorder.wait("cancelled", 1)
    await harness.recorder.wait("finished", 1)
    assert cancelled == ["w1"]
    # the handler stopped: the consumer settled its attempt, fenced, within the ping interval
    assert harness.finished()[0][1]["outcome"] == "cancelled"
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.running_cnt == 0 and info.fail_cnt == 0
    assert [w.status for w in info.worker_states] == [AttemptStatus.CANCELLED]
    assert info.worker_states[0].error is not None and info.worker_states[0].error.type == "Cancelled"
    with pytest.raises(TaskCancelled, match="operator said so"):
        await harness.publisher.wait("t", timeout=1)
    await harness.advance(30.0)  # past the old lease's end: nothing changes any more
    await harness.discover()
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.fail_cnt == 0
    assert [w.status for w in info.worker_states] == [AttemptStatus.CANCELLED]  # never lost
    assert harness.claims("t") == ["w1"]
    assert harness.consumers[0].stats["lost"] == 0 and harness.consumers[0].stats["cancelled"] == 1


async def test_finish_first_wins_over_cancel(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    ops = await _running(harness, gate, cancelled)
    gate.open()
    await harness.recorder.wait("finished", 1)
    with pytest.raises(TransitionRefused, match="succeeded"):
        await ops.cancel("t")
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED
    assert await harness.publisher.wait("t", timeout=1) == "done"
    assert cancelled == []


async def test_cancel_first_wins_over_a_finish_in_flight(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    driver = FreezableDriver(harness.new_driver())
    ops = await _running(harness, gate, cancelled, driver=driver)
    driver.freeze("finish")
    gate.open()  # the handler returns; its finish hangs on the way to the store
    await wait_until(lambda: driver.blocked == ["finish"], what="the finish to hang")
    await ops.cancel("t", "too late")
    driver.thaw("finish")
    await harness.recorder.wait("finished", 1)
    assert harness.finished()[0][1]["outcome"] == "lost"  # the finish was refused
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.results == []
    with pytest.raises(TaskCancelled):
        await harness.publisher.wait("t", timeout=1)


async def test_pause_stops_claims_and_resume_restores_them(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    gate.open()
    ops = Operations(harness.driver, clock=harness.clock)
    assert await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    assert (await ops.pause("t")).paused
    w1 = harness.consumer("w1", {"work": _handler(gate, cancelled)})
    await harness.start(w1)
    await harness.discover()
    await harness.advance(5.0)
    await harness.discover()
    assert harness.claims("t") == []
    assert (await harness.get("t")).status is TaskStatus.PENDING
    assert not (await ops.resume("t")).paused
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    assert harness.claims("t") == ["w1"]
    assert await harness.publisher.wait("t", timeout=1) == "done"


async def test_a_restart_never_runs_the_task_beside_a_cancelled_handler_still_running(
    harness: Harness,
) -> None:
    """Issue 17 A2: without a change stream the cancel reaches the handler at its next ping; a
    restart until then is refused, naming the attempt that still runs. Once the handler stopped
    and its attempt is settled (by its consumer, within the ping interval), the restart runs the
    task again: one handler at a time, across generations."""
    gate = Gate()
    active: list[str] = []
    peak = 0

    async def work(params: Any, ctx: TaskContext) -> str:
        nonlocal peak
        active.append(ctx.worker_id)
        peak = max(peak, len(active))
        try:
            await gate.wait()
        finally:
            active.remove(ctx.worker_id)
        return ctx.worker_id

    w1 = harness.consumer("w1", {"work": work}, driver=NoStreamDriver(harness.new_driver()))
    w2 = harness.consumer("w2", {"work": work}, driver=NoStreamDriver(harness.new_driver()))
    await harness.start(w1)
    assert await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    ops = Operations(harness.driver, clock=harness.clock)
    await ops.cancel("t")
    attempt = (await harness.get("t")).worker_states[0].attempt
    with pytest.raises(TransitionRefused, match=f"{attempt}.*live lease"):
        await ops.restart("t")
    await harness.start(w2)
    await harness.discover()
    assert harness.claims("t") == ["w1"] and active == ["w1"]
    await harness.advance(2.0)  # w1's next ping: cancelled; the handler stops, its attempt settles
    await harness.recorder.wait("finished", 1)
    assert active == [] and harness.finished()[0][1]["outcome"] == "cancelled"
    assert (await ops.restart("t")).status is TaskStatus.PENDING
    gate.open()
    await harness.discover()
    await harness.recorder.wait("finished", 2)
    assert peak == 1
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED and info.results == [harness.claims("t")[1]]
