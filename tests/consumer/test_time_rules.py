"""Retry policies, handler steering (Retry / Snooze / Fail), deadlines and run timeouts (issue 7,
SPEC F13, F23, F25, F29, F40), through a real Consumer on every driver with a FakeClock."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from random import Random
from typing import Any

import pytest

from mscheduler import (
    Fail,
    InvalidInput,
    Retry,
    Snooze,
    Task,
    TaskContext,
    TaskExpired,
    TaskOption,
    TaskStatus,
    UnknownTask,
)
from mscheduler.domain.model import AttemptStatus
from mscheduler.domain.retry import ExponentialRetry, FixedRetry, Jitter
from mscheduler.drivers.base import ClaimParams, ExpireParams
from tests.consumer.support import Harness, NoStreamDriver


async def _run_attempts(harness: Harness, n: int, step: float = 1.0, limit: int = 200) -> None:
    """Advance the fake clock until ``n`` attempts have finished."""
    for _ in range(limit):
        if harness.recorder.counts["finished"] >= n:
            return
        await harness.advance(step)
    raise AssertionError(f"only {harness.recorder.counts['finished']} of {n} attempts finished")


async def test_an_exponential_policy_spaces_the_retries_and_then_fails_for_good(harness: Harness) -> None:
    async def boom(params: Any) -> None:
        raise RuntimeError("down")

    policy = ExponentialRetry(
        base_delay=timedelta(seconds=2), multiplier=3, max_delay=timedelta(seconds=10), max_retries=3
    )
    consumer = harness.consumer("w1", {"boom": boom})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "boom", {}, option=TaskOption(retry=policy)))
    await harness.discover()
    await _run_attempts(harness, 4)
    info = await harness.get("t")
    assert info.status is TaskStatus.FAILED
    gaps = [w.retry_at - w.end_time for w in info.worker_states if w.retry_at and w.end_time]
    assert gaps == [timedelta(seconds=2), timedelta(seconds=6), timedelta(seconds=10), timedelta(0)]
    assert (info.attempts, info.max_attempts) == (4, 4)
    assert info.last_error is not None and info.last_error.message == "down"
    assert info.next_due is None


async def test_jitter_comes_from_the_consumers_seeded_random(harness: Harness) -> None:
    async def boom(params: Any) -> None:
        raise RuntimeError("down")

    policy = FixedRetry(delay=timedelta(seconds=10), max_retries=1, jitter=Jitter.full())
    consumer = harness.consumer("w1", {"boom": boom})
    consumer.rng = Random(7)
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "boom", {}, option=TaskOption(retry=policy)))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    (entry,) = (await harness.get("t")).worker_states
    assert entry.end_time is not None and entry.retry_at is not None
    expected = policy.next_retry([entry.end_time], entry.end_time, Random(7))
    assert entry.retry_at == expected
    assert entry.retry_at - entry.end_time != timedelta(seconds=10)  # jittered (seed 7)


async def test_retry_snooze_and_fail_steer_the_task(harness: Harness) -> None:
    calls: list[int] = []

    async def steer(params: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt_no)
        if ctx.attempt_no == 1:
            raise Snooze(after=30, reason="not ready")
        if ctx.attempt_no == 2:
            raise Retry(after=timedelta(seconds=5), reason="try again soon")
        raise Fail("the order was deleted")

    consumer = harness.consumer("w1", {"steer": steer})
    await harness.start(consumer)
    option = TaskOption(max_unexpected_retries=10, retry_delay=timedelta(hours=1))
    await harness.publisher.send(Task("t", "steer", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    info = await harness.get("t")
    assert info.status is TaskStatus.PENDING and info.fail_cnt == 0  # a snooze is not counted
    snoozed = info.worker_states[0]
    assert snoozed.status is AttemptStatus.SNOOZED and snoozed.end_time is not None
    assert info.claim_at == snoozed.end_time + timedelta(seconds=30)
    await _run_attempts(harness, 2)
    info = await harness.get("t")
    retried = info.worker_states[1]
    assert (retried.status, info.fail_cnt) == (AttemptStatus.FAILED, 1)  # Retry is counted
    assert retried.error is not None and retried.error.type == "Retry"
    assert retried.end_time is not None and info.claim_at == retried.end_time + timedelta(seconds=5)
    await _run_attempts(harness, 3)
    info = await harness.get("t")
    assert info.status is TaskStatus.FAILED, "Fail ends the task whatever the budget"
    last = info.worker_states[2]
    assert last.final and last.error is not None and last.error.type == "Fail"
    assert calls == [1, 2, 3]


async def test_a_run_timeout_cancels_the_attempt_and_the_policy_retries_it(harness: Harness) -> None:
    started: list[int] = []

    async def slow(params: Any, ctx: TaskContext) -> str:
        started.append(ctx.attempt_no)
        if ctx.attempt_no == 1:
            await asyncio.sleep(3600)  # pings keep the lease; the run timeout does not
        return "ok"

    consumer = harness.consumer("w1", {"slow": slow})
    await harness.start(consumer)
    option = TaskOption(
        run_timeout=timedelta(seconds=20),
        retry_delay=timedelta(seconds=1),
        ping_interval=timedelta(seconds=1),
        worker_timeout=timedelta(seconds=5),
    )
    await harness.publisher.send(Task("t", "slow", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    for _ in range(19):  # pings keep the lease; 19 s of the consumer's clock, a blink of real time
        await harness.advance(1.0)
    assert not harness.recorder.counts["finished"]
    await harness.advance(1.0)
    # issue 17 B6: at the run timeout on the consumer's (fake) clock, not after real seconds
    await harness.recorder.wait("finished", 1, timeout=2)
    info = await harness.get("t")
    first = info.worker_states[0]
    assert first.status is AttemptStatus.FAILED and first.error is not None
    assert first.error.type == "RunTimedOut" and "run_timeout" in first.error.message
    await _run_attempts(harness, 2)
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED
    assert started == [1, 2]


async def test_a_task_past_its_deadline_is_never_run_and_ends_expired(harness: Harness) -> None:
    now = harness.clock.now()
    option = TaskOption(deadline=now + timedelta(seconds=10))
    await harness.publisher.send(Task("late", "work", {}, option=option))
    await harness.publisher.send(Task("in-time", "work", {}, option=option))
    driver = harness.new_driver()
    # the claim refuses it atomically once the deadline has passed, before any pass marks it
    assert await driver.claim(ClaimParams("w9", ["work"], now + timedelta(seconds=11), ["a1"])) == []
    ran: list[str] = []

    async def work(params: Any, ctx: TaskContext) -> None:
        ran.append(ctx.key)

    consumer = harness.consumer("w1", {"work": work})
    await harness.publisher.send(Task("no-deadline", "work", {}))
    await harness.advance(11.0)
    await harness.start(consumer)  # its first poll marks them expired
    await harness.recorder.wait("finished", 1)
    assert ran == ["no-deadline"]
    for key in ("late", "in-time"):
        info = await harness.get(key)
        assert info.status is TaskStatus.EXPIRED and info.worker_states == [] and info.claim_at is None
    with pytest.raises(TaskExpired):
        await harness.publisher.wait("late", timeout=1)
    assert await driver.expire_deadlines(ExpireParams(harness.clock.now())) == 0  # done once


async def test_a_running_task_is_not_expired_by_its_deadline(harness: Harness) -> None:
    gate = asyncio.Event()

    async def work(params: Any) -> str:
        await gate.wait()
        return "done"

    consumer = harness.consumer("w1", {"work": work})
    await harness.start(consumer)
    now = harness.clock.now()
    option = TaskOption(deadline=now + timedelta(seconds=3), worker_timeout=timedelta(seconds=60))
    await harness.publisher.send(Task("t", "work", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    await harness.advance(5.0)  # the deadline passes while it runs: it started in time
    gate.set()
    await harness.recorder.wait("finished", 1)
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED


async def test_a_lost_lease_waits_the_policys_delay(harness: Harness) -> None:
    """The bulk lease-expiry pass applies the policy's first delay (computed by the store on a
    real server; on mongomock, which cannot add to dates in a pipeline, task by task)."""
    driver = harness.new_driver()
    now = harness.clock.now()
    policy = FixedRetry(delay=timedelta(seconds=42), max_retries=3)
    option = TaskOption(retry=policy, ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=2))
    await harness.publisher.send(Task("t", "work", {}, option=option))
    (_claimed,) = await driver.claim(ClaimParams("ghost", ["work"], now, ["a1"]))
    later = now + timedelta(seconds=3)
    assert await driver.expire_leases(ExpireParams(later)) == 1
    info = await harness.get("t")
    (entry,) = info.worker_states
    assert entry.status is AttemptStatus.LOST and entry.retry_at == later + timedelta(seconds=42)
    assert info.claim_at == later + timedelta(seconds=42)


async def test_a_deadline_is_marked_expired_at_the_deadline_not_at_the_next_poll(harness: Harness) -> None:
    """Issue 17 B7: the consumer queues a known task's deadline like any due time and runs the
    deadline pass then, not at its next poll (30 s here), so ``wait()`` learns it at once."""
    gate = asyncio.Event()

    async def busy(params: Any) -> None:
        await gate.wait()

    consumer = harness.consumer("w1", {"work": busy}, poll_interval=30.0, stream_poll_interval=30.0)
    await harness.start(consumer)
    await harness.publisher.send(Task("long", "work", {}))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)  # its only slot is taken: "late" waits
    option = TaskOption(deadline=harness.clock.now() + timedelta(seconds=1))
    await harness.publisher.send(Task("late", "work", {}, option=option))
    await harness.discover()  # a poll (or, with a change stream, the insert's event) tells of it
    await harness.advance(0.5)
    assert (await harness.get("late")).status is TaskStatus.PENDING
    await harness.advance(0.5)  # the deadline; the next poll is 29 s away
    assert (await harness.get("late")).status is TaskStatus.EXPIRED
    with pytest.raises(TaskExpired):
        await harness.publisher.wait("late", timeout=0)
    gate.set()


async def test_a_task_sent_with_run_at_after_its_deadline_is_refused(harness: Harness) -> None:
    """Issue 17 B7: it could never start; refused at send naming both fields, nothing written."""
    now = harness.clock.now()
    with pytest.raises(InvalidInput, match=r"run_at .* is after deadline"):
        TaskOption(run_at=now + timedelta(seconds=10), deadline=now + timedelta(seconds=5))
    with pytest.raises(InvalidInput, match=r"run_at.*deadline"):
        await harness.publisher.send(
            Task("never", "work", {}, option={"run_at": now + timedelta(hours=1), "deadline": now})
        )
    with pytest.raises(UnknownTask):
        await harness.get("never")
    ok = TaskOption(run_at=now + timedelta(seconds=5), deadline=now + timedelta(seconds=5))
    assert await harness.publisher.send(Task("just-in-time", "work", {}, option=ok))


async def test_a_consumer_wakes_for_the_retry_and_snooze_times_it_wrote(harness: Harness) -> None:
    """Issue 17 B8: without a change stream (a standalone server, mongomock) a retry due in 5 s
    and a snooze due in 3 s run then, not at the next poll (30 s here): the consumer queued the
    due times it wrote itself."""
    calls: dict[str, int] = {}

    async def work(params: Any, ctx: TaskContext) -> str:
        calls[ctx.key] = calls.get(ctx.key, 0) + 1
        if calls[ctx.key] == 1:
            if ctx.key == "snoozy":
                raise Snooze(3)
            raise RuntimeError("once")
        return "ok"

    consumer = harness.consumer(
        "w1",
        {"work": work},
        driver=NoStreamDriver(harness.new_driver()),
        poll_interval=30.0,
        concurrency=2,
    )
    await harness.start(consumer)
    option = TaskOption(retry_delay=timedelta(seconds=5))
    await harness.publisher.send_many([Task("retry", "work", {}, option=option), Task("snoozy", "work", {})])
    await harness.discover()
    await harness.recorder.wait("finished", 2)
    await harness.advance(3.0)
    await harness.recorder.wait("finished", 3, timeout=2)
    assert calls == {"retry": 1, "snoozy": 2}
    await harness.advance(2.0)
    await harness.recorder.wait("finished", 4, timeout=2)
    assert calls == {"retry": 2, "snoozy": 2}
    for key in ("retry", "snoozy"):
        assert (await harness.get(key)).status is TaskStatus.SUCCEEDED
