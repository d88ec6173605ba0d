"""Leases by ping (SPEC F4, G1): a stalled worker loses its task, and its late writes are refused."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.domain.model import AttemptStatus
from tests.consumer.support import FreezableDriver, Gate, Harness
from tests.helpers import wait_until

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=3),
    retry_delay=timedelta(seconds=0),
)


async def _stalled_a_then_b_takes_over(
    harness: Harness, *, a_returns_in_time: bool
) -> tuple[Consumer, FreezableDriver, Gate]:
    """A claims; A's pings and finishes hang (a stalled worker); B takes over after the lease.

    With ``a_returns_in_time`` A's handler returns before its lease ends and only its finish is
    stuck; otherwise A's handler is still running at its lease end and A cancels it itself.
    """
    gate_a = Gate()

    async def work(params: Any, ctx: TaskContext) -> str:
        if ctx.worker_id == "A":
            await gate_a.wait()
        return f"result of {ctx.worker_id}"

    frozen = FreezableDriver(harness.new_driver())
    frozen.freeze("ping", "finish")
    a = harness.consumer("A", {"work": work}, driver=frozen, claim_lease=timedelta(seconds=3))
    await harness.start(a)
    await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    await harness.discover(a)
    await harness.recorder.wait("claimed", 1)
    frozen.freeze("claim")  # A is stalled for everything from now on
    if a_returns_in_time:
        gate_a.open()  # A's handler returns; its finish hangs in the stall
        await wait_until(lambda: "finish" in frozen.blocked, what="A's finish to hang")
    b = harness.consumer("B", {"work": work}, claim_lease=timedelta(seconds=3))
    await harness.start(b)
    assert harness.claims("t") == ["A"], "B must not claim a task whose lease is alive"

    await harness.advance(2.0)  # A's pinger wakes and hangs; the lease is still alive
    assert "ping" in frozen.blocked
    await harness.discover(b)
    assert harness.claims("t") == ["A"]

    await harness.advance(1.5)  # past the claim lease: B's poll marks A's entry lost
    await harness.discover(b)
    await harness.recorder.wait("claimed", 2)
    await harness.recorder.wait("finished", 1 if a_returns_in_time else 2)
    assert harness.claims("t") == ["A", "B"]
    b_attempt = harness.recorder.of("claimed")[1][1]["attempt"]
    b_finished = ("B", {"key": "t", "attempt": b_attempt, "outcome": "succeeded", "error": None})

    def core(finished: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        return finished[0], {k: finished[1][k] for k in b_finished[1]}  # not name, duration

    if a_returns_in_time:
        assert [core(f) for f in harness.finished()] == [b_finished]
    else:
        # A stopped trusting its lease at the lease's end, reply or no reply: its handler was
        # cancelled (writing nothing) before B could take over.
        a_finished, later = harness.finished()
        assert (a_finished[0], a_finished[1]["outcome"]) == ("A", "lost")
        assert core(later) == b_finished
        assert [w for w, _ in harness.recorder.of("lost")] == ["A"]
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED
    assert [(w.worker_id, w.status) for w in info.worker_states] == [
        ("A", AttemptStatus.LOST),
        ("B", AttemptStatus.SUCCEEDED),
    ]
    assert info.worker_states[0].error is not None
    assert info.worker_states[0].error.type == "LeaseExpired"
    return a, frozen, gate_a


async def _assert_b_intact(harness: Harness) -> None:
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED
    assert [(w.worker_id, w.status) for w in info.worker_states] == [
        ("A", AttemptStatus.LOST),
        ("B", AttemptStatus.SUCCEEDED),
    ]
    assert info.results == ["result of B"]
    assert info.success_cnt == 1 and info.fail_cnt == 1 and info.running_cnt == 0


async def test_stalled_worker_is_taken_over_and_its_late_finish_refused(harness: Harness) -> None:
    a, frozen, _ = await _stalled_a_then_b_takes_over(harness, a_returns_in_time=True)

    frozen.thaw("finish")  # A's success reaches the store after B took over
    await harness.recorder.wait("finished", 2)
    late = harness.finished()[1]
    assert late[0] == "A"
    assert late[1]["outcome"] == "lost", "A's late success must be refused"
    assert a.stats["succeeded"] == 0 and a.stats["lost"] == 1
    assert a.running_count == 0
    await _assert_b_intact(harness)


async def test_stalled_worker_stops_its_handler_at_the_lease_end(harness: Harness) -> None:
    """A's handler still runs at its lease end while A's ping hangs: A cancels it, writes nothing."""
    a, frozen, gate_a = await _stalled_a_then_b_takes_over(harness, a_returns_in_time=False)
    gate_a.open()  # too late: the handler was cancelled
    frozen.thaw("ping", "finish")
    ended = lambda: a.stats["lost"] + a.stats["succeeded"] >= 1 and a.running_count == 0  # noqa: E731
    await wait_until(ended, what="A to settle its attempt")
    assert a.stats["succeeded"] == 0 and a.stats["lost"] == 1
    assert "finish" not in frozen.blocked, "a lost attempt writes no outcome"
    await _assert_b_intact(harness)


async def test_stalled_worker_whose_ping_reports_lost_while_its_finish_is_pending(harness: Harness) -> None:
    """A wakes up: its hung ping says 'lost' while its finish is still in flight.

    The consumer must still settle the attempt: a 'finished' event, nothing left running, no
    further pings for a task it no longer holds.
    """
    a, frozen, _ = await _stalled_a_then_b_takes_over(harness, a_returns_in_time=True)

    assert {"finish", "ping"} <= set(frozen.blocked)
    frozen.thaw("ping", "finish")
    await harness.recorder.wait("finished", 2)
    late = harness.finished()[1]
    assert late[0] == "A" and late[1]["outcome"] == "lost"
    assert a.running_count == 0
    assert a.stats["succeeded"] == 0
    pings = harness.recorder.counts["ping"]
    await harness.advance(1.0)
    await harness.advance(1.0)
    assert harness.recorder.counts["ping"] == pings, "A keeps pinging a task it no longer holds"
    await _assert_b_intact(harness)


async def test_stalled_worker_notices_the_lost_lease_at_its_next_ping(harness: Harness) -> None:
    """A's event loop stalls past its lease; when it resumes, its next ping cancels the handler."""
    gate = Gate()
    cancelled: list[int] = []

    async def work(params: Any, ctx: TaskContext) -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt_no)
            raise
        return "late"

    frozen = FreezableDriver(harness.new_driver())
    frozen.freeze("ping")
    a = harness.consumer(
        "A", {"work": work}, driver=frozen, claim_lease=timedelta(seconds=3), poll_interval=100.0
    )
    await harness.start(a)
    await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    await harness.discover(a)
    await harness.recorder.wait("claimed", 1)
    await harness.advance(1.0)  # A's ping hangs ...
    assert frozen.blocked == ["ping"]
    harness.clock.advance(timedelta(seconds=5))  # ... far past its lease
    frozen.thaw("ping")
    await harness.recorder.wait("ping", 1)
    # The late ping was judged at the time it was sent: whatever it set is already past, so
    # the lease stays expired (a ping never makes a lease reach beyond its own time + timeout).
    info = await harness.get("t")
    assert info.worker_states[0].ping_expire_time <= harness.clock.now()
    await harness.advance(1.0)  # the next ping, on time, finds the lease gone
    await harness.recorder.wait("lost", 1)
    await harness.recorder.wait("finished", 1)
    assert harness.finished()[0][1]["outcome"] == "lost"
    assert cancelled == [1], "A's handler must be cancelled once its lease is lost"
    assert a.stats["lost"] == 1 and a.stats["succeeded"] == 0
    await harness.discover(a)  # any consumer's poll marks it lost (A may have done so already)
    info = await harness.get("t")
    assert info.worker_states[0].status is AttemptStatus.LOST
    assert info.worker_states[0].error is not None and info.worker_states[0].error.type == "LeaseExpired"
