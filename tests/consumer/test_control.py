"""Task control as consumers see it: cancel reaches a running handler at its next ping and fences
its finish; the cancel / finish race has one winner; pause stops claims, resume restores them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    Operations,
    Task,
    TaskCancelled,
    TaskContext,
    TaskOption,
    TaskStatus,
    TransitionRefused,
)
from tests.consumer.support import FreezableDriver, Gate, Harness, NoStreamDriver, settle

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
    gate, cancelled = Gate(), []
    ops = await _running(harness, gate, cancelled, driver=NoStreamDriver(harness.new_driver()))
    info = await ops.cancel("t", "operator said so")
    assert info.status is TaskStatus.CANCELLED
    assert cancelled == []  # the handler learns at its next ping
    await harness.advance(2.0)
    await harness.recorder.wait("cancelled", 1)
    await harness.recorder.wait("finished", 1)
    assert cancelled == ["w1"]
    assert harness.finished()[0][1]["outcome"] == "lost"  # nothing written for it
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.running_cnt == 1  # until its lease ends
    with pytest.raises(TaskCancelled, match="operator said so"):
        await harness.publisher.wait("t", timeout=1)
    await harness.advance(30.0)  # the lease ends: the entry is lost, the task stays cancelled
    await harness.discover()
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.running_cnt == 0
    assert harness.claims("t") == ["w1"]


async def test_finish_first_wins_over_cancel(harness: Harness) -> None:
    gate, cancelled = Gate(), []
    ops = await _running(harness, gate, cancelled)
    gate.open()
    await harness.recorder.wait("finished", 1)
    with pytest.raises(TransitionRefused, match="succeeded"):
        await ops.cancel("t")
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED
    assert await harness.publisher.wait("t", timeout=1) == "done"
    assert cancelled == []


async def test_cancel_first_wins_over_a_finish_in_flight(harness: Harness) -> None:
    gate, cancelled = Gate(), []
    driver = FreezableDriver(harness.new_driver())
    ops = await _running(harness, gate, cancelled, driver=driver)
    driver.freeze("finish")
    gate.open()  # the handler returns; its finish hangs on the way to the store
    await settle()
    assert driver.blocked == ["finish"]
    await ops.cancel("t", "too late")
    driver.thaw("finish")
    await harness.recorder.wait("finished", 1)
    assert harness.finished()[0][1]["outcome"] == "lost"  # the finish was refused
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.results == []
    with pytest.raises(TaskCancelled):
        await harness.publisher.wait("t", timeout=1)


async def test_pause_stops_claims_and_resume_restores_them(harness: Harness) -> None:
    gate, cancelled = Gate(), []
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
