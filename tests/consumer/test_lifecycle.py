"""Worker lifecycle (SPEC F9) and supervision (STYLE 6): graceful, hard and remote stop; side tasks dying."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Consumer, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.domain.exceptions import ConsumerStopped, StorageError
from mscheduler.domain.model import AttemptStatus
from tests.consumer.support import FailingDriver, Gate, Harness, settle
from tests.helpers import as_driver

LONG_LEASE = TaskOption(
    ping_interval=timedelta(seconds=10),
    worker_timeout=timedelta(minutes=10),
    max_unexpected_retries=0,  # a release must not count: one failure would fail the task
)


def _blocking(gate: Gate, cancelled: list[str]) -> Any:
    async def work(params: Any, ctx: TaskContext) -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.worker_id)
            raise
        return f"done by {ctx.worker_id}"

    return work


async def _a_runs_t(harness: Harness, work: Any, **kwargs: Any) -> Consumer:
    a = harness.consumer("A", {"work": work}, **kwargs)
    await harness.start(a)
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover(a)
    await harness.recorder.wait("claimed", 1)
    return a


async def test_graceful_stop_releases_after_the_grace_and_another_consumer_takes_over(
    harness: Harness,
) -> None:
    gate, cancelled = Gate(), list[str]()
    a = await _a_runs_t(harness, _blocking(gate, cancelled))
    b = harness.consumer("B", {"work": _blocking(gate, cancelled)})
    await harness.start(b)
    assert harness.claims("t") == ["A"]

    stopping = asyncio.create_task(a.stop(grace=30.0))  # on the consumer's (fake) clock
    await harness.advance(29.9)
    assert not stopping.done() and cancelled == [], "cancelled before the grace period ended"
    await harness.discover(b)
    assert harness.claims("t") == ["A"], "B must not claim while A may still finish"

    await harness.advance(0.2)
    await asyncio.wait_for(stopping, 5)
    assert cancelled == ["A"]
    assert harness.finished()[0][0] == "A" and harness.finished()[0][1]["outcome"] == "released"
    assert a.running_count == 0

    # The slot is free at once: no waiting for A's (ten-minute) lease to expire. (With a change
    # stream B has claimed it already; polling is the floor.)
    await harness.discover(b)
    await harness.recorder.wait("claimed", 2)
    assert harness.claims("t") == ["A", "B"]
    info = await harness.get("t")
    assert [(w.worker_id, w.status) for w in info.worker_states] == [
        ("A", AttemptStatus.RELEASED),
        ("B", AttemptStatus.RUNNING),
    ]
    assert info.fail_cnt == 0 and info.status is TaskStatus.RUNNING
    gate.open()
    await harness.recorder.wait("finished", 2)
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED
    assert info.results == ["done by B"]
    assert info.worker_states[1].start_time == info.worker_states[0].end_time


async def test_handler_that_finishes_within_the_grace_is_recorded_succeeded(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    a = await _a_runs_t(harness, _blocking(gate, cancelled))
    stopping = asyncio.create_task(a.stop(grace=30.0))
    await harness.advance(10.0)
    assert not stopping.done()
    await harness.publisher.send(Task("late", "work", {}))
    await harness.discover(a)
    gate.open()
    await asyncio.wait_for(stopping, 5)
    assert cancelled == []
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED and info.results == ["done by A"]
    assert harness.claims() == ["A"], "a stopping consumer must not claim"
    assert (await harness.get("late")).status is TaskStatus.PENDING
    await a.stop()  # idempotent
    await a.stop(grace=0)


async def test_second_stop_with_zero_grace_cancels_at_once(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    a = await _a_runs_t(harness, _blocking(gate, cancelled))
    graceful = asyncio.create_task(a.stop(grace=1000.0))
    await settle()
    assert not graceful.done() and cancelled == []
    await asyncio.wait_for(a.stop(grace=0), 5)  # no clock movement needed
    await asyncio.wait_for(graceful, 5)
    assert cancelled == ["A"]
    info = await harness.get("t")
    assert [w.status for w in info.worker_states] == [AttemptStatus.RELEASED]
    assert info.fail_cnt == 0


async def test_remote_stop_through_the_database(harness: Harness) -> None:
    async def work(params: Any) -> str:
        return "ok"

    a = harness.consumer("A", {"work": work}, heartbeat_interval=5.0)
    b = harness.consumer("B", {"work": work}, heartbeat_interval=5.0)
    await harness.start(a, b)
    run = asyncio.create_task(a.run())
    assert await harness.driver.request_worker_stop("A", harness.clock.now())
    assert not await harness.driver.request_worker_stop("nobody", harness.clock.now())
    await harness.advance(4.0)
    assert not run.done()
    await harness.advance(1.0)  # A's heartbeat sees the request
    await harness.recorder.wait("stopped", 1)
    await asyncio.wait_for(run, 5)  # returns normally: a requested stop is not a failure
    assert a.error is None
    workers = {w["worker_id"]: w for w in await harness.driver.list_workers()}
    assert workers["A"]["stop_time"] is not None
    assert workers["B"]["stop_time"] is None
    assert not await harness.driver.request_worker_stop("A", harness.clock.now()), "A already stopped"

    # B is untouched and keeps working.
    await harness.publisher.send(Task("t", "work", {}))
    await harness.discover(b)
    await harness.recorder.wait("finished", 1)
    assert harness.claims("t") == ["B"]


async def test_a_dying_side_task_stops_the_consumer_and_releases_its_handlers(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    failing = FailingDriver(harness.new_driver())
    a = await _a_runs_t(harness, _blocking(gate, cancelled), driver=failing, concurrency=2)
    run = asyncio.create_task(a.run())
    await settle()
    # a configuration error (no retry fixes it): the consumer stops, loudly
    failing.fail["find_wakeups"] = StorageError("not authorized on this database", config=True)
    await harness.advance(1.0)  # the poll timer: the poller dies
    with pytest.raises(ConsumerStopped) as caught:
        await asyncio.wait_for(run, 5)
    assert isinstance(caught.value.__cause__, StorageError)
    assert a.error is caught.value.__cause__
    assert cancelled == ["A"]
    assert a.running_count == 0
    info = await harness.get("t")
    assert [w.status for w in info.worker_states] == [AttemptStatus.RELEASED]
    assert info.fail_cnt == 0
    workers = {w["worker_id"]: w for w in await harness.driver.list_workers()}
    assert workers["A"]["stop_time"] is not None
    assert all(t.done() for t in a._side.values()), "no side task may outlive the consumer"


async def test_a_permanent_storage_error_that_is_not_configuration_does_not_stop_the_consumer(
    harness: Harness,
) -> None:
    """Refused commands that are neither transient nor configuration errors are logged at ERROR
    and retried after a pause: the poller, claimer and finisher carry on (issue 6, A5)."""
    failing = FailingDriver(harness.new_driver())
    done: list[str] = []

    async def work(params: Any) -> str:
        done.append(params["n"])
        return "ok"

    a = harness.consumer("A", {"work": work}, driver=failing)
    await harness.start(a)
    failing.fail["find_wakeups"] = StorageError("BadValue: something odd", transient=False)
    failing.fail["claim"] = StorageError("BadValue: something odd", transient=False)
    await harness.publisher.send(Task("t", "work", {"n": "t"}))
    for _ in range(10):
        await harness.advance(6.0)  # past the error back-off
    failing.fail.clear()
    for _ in range(10):
        if done:
            break
        await harness.advance(6.0)
    assert a.state == "running" and a.error is None
    assert done == ["t"]
    await a.stop()
    assert (a.state, a.stop_reason) == ("stopped", "requested")


async def test_consumer_stops_loudly_even_when_the_finisher_dies(harness: Harness) -> None:
    """The finisher dies on a write: handlers still running are cancelled and run() raises.

    Their outcomes cannot be written any more (the leases then expire and others take over);
    what matters is that the consumer does not hang half-alive waiting for a dead finisher.
    """
    gate, cancelled = Gate(), list[str]()
    failing = FailingDriver(harness.new_driver())
    quick_done: list[str] = []

    async def quick(params: Any) -> str:
        quick_done.append("quick")
        return "quick"

    a = harness.consumer(
        "A", {"work": _blocking(gate, cancelled), "quick": quick}, driver=failing, concurrency=2
    )
    await harness.start(a)
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover(a)
    await harness.recorder.wait("claimed", 1)
    run = asyncio.create_task(a.run())
    failing.fail["finish"] = StorageError("write concern unsatisfiable", config=True)
    await harness.publisher.send(Task("q", "quick", {}))
    await harness.discover(a)
    with pytest.raises(ConsumerStopped):
        await asyncio.wait_for(run, 5)
    assert quick_done == ["quick"]
    assert cancelled == ["A"]
    assert a.running_count == 0
    assert all(t.done() for t in a._side.values())
    info = await harness.get("t")
    assert [w.status for w in info.worker_states] == [AttemptStatus.RUNNING], "nothing could be written"


async def test_stop_before_start_and_context_manager(harness: Harness) -> None:
    async def work(params: Any) -> str:
        return "ok"

    idle = harness.consumer("idle", {"work": work})
    await asyncio.wait_for(idle.stop(), 5)
    async with harness.consumer("cm", {"work": work}) as consumer:
        await harness.publisher.send(Task("t", "work", {}))
        await harness.discover(consumer)
        await harness.recorder.wait("finished", 1)
    await asyncio.wait_for(consumer.wait_stopped(), 5)
    assert (await harness.get("t")).results == ["ok"]


async def test_a_stop_whose_caller_is_cancelled_still_completes(harness: Harness) -> None:
    """Cancelling the caller of stop() (an outer timeout) must not leave the consumer half stopped."""
    gate, cancelled = Gate(), list[str]()
    a = await _a_runs_t(harness, _blocking(gate, cancelled))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(a.stop(grace=30.0), 0.05)  # real-time timeout; grace is fake time
    assert cancelled == [], "the graceful stop goes on in the background"
    await asyncio.wait_for(a.stop(grace=0), 5)  # a later stop() finishes it, it does not hang
    assert cancelled == ["A"]
    info = await harness.get("t")
    assert [w.status for w in info.worker_states] == [AttemptStatus.RELEASED]


async def test_a_stop_during_a_claim_releases_what_the_claim_took(harness: Harness) -> None:
    """The store applied A's claim but the reply is still on its way when A stops: A waits for it
    and releases the task (no orphan lease, no retry used), so B can run it at once."""
    from tests.consumer.support import WrappedDriver

    reply = asyncio.Event()
    applied = asyncio.Event()

    class SlowReply(WrappedDriver):
        async def claim(self, params: Any) -> Any:
            result = await self.inner.claim(params)
            if result:
                applied.set()
                await reply.wait()
            return result

    ran: list[str] = []

    async def work(params: Any, ctx: TaskContext) -> None:
        ran.append(ctx.worker_id)

    a = harness.consumer("A", {"work": work}, driver=SlowReply(harness.new_driver()))
    await harness.start(a)
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover(a)
    await asyncio.wait_for(applied.wait(), 5)
    stopping = asyncio.create_task(a.stop(grace=30.0))
    await settle()
    assert not stopping.done(), "stop() waits for the claim in flight, within the grace period"
    reply.set()
    await asyncio.wait_for(stopping, 5)
    assert ran == []
    info = await harness.get("t")
    assert [(w.worker_id, w.status) for w in info.worker_states] == [("A", AttemptStatus.RELEASED)]
    assert info.fail_cnt == 0 and info.status is TaskStatus.PENDING

    b = harness.consumer("B", {"work": work})
    await harness.start(b)
    await harness.discover(b)
    await harness.recorder.wait("finished", 1)
    assert ran == ["B"]


async def test_a_transient_error_in_the_first_poll_does_not_stop_the_start(harness: Harness) -> None:
    from mscheduler.testing.faults import FaultyDriver

    faulty = FaultyDriver(harness.new_driver())
    faulty.fail_next("find_wakeups")  # the first poll, inside start()
    done: list[str] = []

    async def work(params: Any) -> None:
        done.append("ran")

    a = harness.consumer("A", {"work": work}, driver=as_driver(faulty))
    await harness.start(a)
    await harness.publisher.send(Task("t", "work", {}))
    await harness.discover(a)
    await harness.recorder.wait("finished", 1)
    assert done == ["ran"] and faulty.calls["find_wakeups"] >= 2
