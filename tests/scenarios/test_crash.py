"""A consumer's process dies mid-handler: its task is run again elsewhere, in bounded (fake) time.

``crash_consumer`` kills the consumer's ``FaultyDriver`` (nothing it does reaches the store any
more, no clean-up write) and cancels its asyncio tasks, as a SIGKILL would. Its running entry stays
in the store until the lease ends; then another consumer marks it lost and takes the task over.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from tests.helpers import Recorder, as_driver
from tests.scenarios.harness import advance, advance_until, running_entries

WORKER_TIMEOUT = timedelta(seconds=5)
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=WORKER_TIMEOUT, retry_delay=timedelta(seconds=1)
)
POLL = 1.0
STEP = 0.25


def consumer(driver: Any, worker_id: str, clock: FakeClock) -> Consumer:
    return Consumer(
        driver,
        worker_id=worker_id,
        clock=clock,
        poll_interval=POLL,
        claim_lease=WORKER_TIMEOUT,
        concurrency=2,
    )


def claimed_by(recorder: Recorder, worker_id: str, key: str) -> bool:
    return any(w == worker_id and d["key"] == key for w, d in recorder.of("claimed"))


async def test_task_of_a_crashed_consumer_runs_again_on_another(make_driver, fake_clock: FakeClock) -> None:
    """Crash mid-handler (after a ping): the task runs again on B within worker_timeout + poll."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a = consumer(FaultyDriver(store), "A", fake_clock)
    b = consumer(make_driver(fake_clock), "B", fake_clock)
    runs: list[tuple[str, int]] = []

    async def work(params: Any, ctx: TaskContext) -> str:
        runs.append((ctx.worker_id, ctx.attempt_no))
        if ctx.worker_id == "A":
            await asyncio.Event().wait()  # A dies before this ends
        return f"done by {ctx.worker_id}"

    a.register("job", work)
    b.register("job", work)
    recorder = Recorder(a, b)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    await advance(fake_clock, 1.0)  # A pings once: its lease is now the task's worker_timeout
    assert recorder.counts["ping"] >= 1
    await b.start()

    await crash_consumer(a)
    doc = await store.get_task("t1")
    assert [e["worker_id"] for e in running_entries(doc)] == ["A"], "a dead process leaves its lease"

    took = await advance_until(fake_clock, lambda: claimed_by(recorder, "B", "t1"), step=STEP, limit=60)
    assert took <= WORKER_TIMEOUT.total_seconds() + POLL + STEP
    await recorder.wait("finished")
    await b.stop()

    info = await publisher.get("t1")
    assert info.status is TaskStatus.SUCCEEDED
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [("A", "lost"), ("B", "succeeded")]
    assert info.worker_states[0].error is not None and info.worker_states[0].error.type == "LeaseExpired"
    assert info.results == ["done by B"]
    assert runs == [("A", 1), ("B", 2)], "run again only after the crash, once"


async def test_a_crash_right_after_the_claim_holds_the_task_only_for_its_own_worker_timeout(
    make_driver, fake_clock: FakeClock
) -> None:
    """No consumer-wide first lease (it used to be 30 s): the claim's lease is the task's own
    worker_timeout, here 0.5 s, so B takes over within 0.5 s + a poll (issue 6, A1)."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    short = TaskOption(
        ping_interval=timedelta(milliseconds=100),
        worker_timeout=timedelta(milliseconds=500),
        retry_delay=timedelta(0),  # the lost lease's retry is at once: only the lease is measured
    )
    a = Consumer(as_driver(a_driver), worker_id="A", clock=fake_clock, poll_interval=POLL)
    b = Consumer(make_driver(fake_clock), worker_id="B", clock=fake_clock, poll_interval=POLL)
    assert a.claim_lease is None
    runs: list[str] = []

    async def work(params: Any, ctx: TaskContext) -> None:
        runs.append(ctx.worker_id)
        if ctx.worker_id == "A":
            await asyncio.Event().wait()

    a.register("job", work)
    b.register("job", work)
    recorder = Recorder(a, b)
    await publisher.send(Task("t1", "job", option=short))
    await a.start()
    await recorder.wait("claimed")
    await crash_consumer(a)
    (entry,) = running_entries(await store.get_task("t1"))
    assert entry["ping_expire_time"] - entry["start_time"] == timedelta(milliseconds=500)
    await b.start()
    took = await advance_until(fake_clock, lambda: claimed_by(recorder, "B", "t1"), step=0.1, limit=10)
    assert took <= 0.5 + POLL + 0.1
    await recorder.wait("finished")
    await b.stop()
    assert runs == ["A", "B"]


async def test_crash_before_the_first_ping_is_rescued_after_the_claim_lease(
    make_driver, fake_clock: FakeClock
) -> None:
    """A consumer that dies right after its claim holds only the claim lease; then B runs the task."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a = consumer(a_driver, "A", fake_clock)
    b = consumer(make_driver(fake_clock), "B", fake_clock)
    runs: list[str] = []

    async def work(params: Any, ctx: TaskContext) -> None:
        runs.append(ctx.worker_id)
        if ctx.worker_id == "A":
            await asyncio.Event().wait()

    a.register("job", work)
    b.register("job", work)
    recorder = Recorder(a, b)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    await crash_consumer(a)
    assert a_driver.calls["ping"] == 0
    await b.start()
    took = await advance_until(fake_clock, lambda: claimed_by(recorder, "B", "t1"), step=STEP, limit=60)
    assert a.claim_lease is not None
    assert took <= a.claim_lease.total_seconds() + POLL + STEP
    await recorder.wait("finished")
    await b.stop()
    info = await publisher.get("t1")
    assert info.status is TaskStatus.SUCCEEDED
    assert [w.status.value for w in info.worker_states] == ["lost", "succeeded"]
    assert runs == ["A", "B"]


async def test_crashes_use_the_retry_budget_then_the_task_fails_with_the_reason(
    make_driver, fake_clock: FakeClock
) -> None:
    """Each crash is a lost attempt (SPEC F3): after max_unexpected_retries + 1 the task fails for good."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    option = OPTION.model_copy(update={"max_unexpected_retries": 1})
    await publisher.send(Task("t1", "job", option=option))

    async def hang(params: Any) -> None:
        await asyncio.Event().wait()

    for n in range(2):
        victim = consumer(FaultyDriver(store), f"crasher-{n}", fake_clock)
        victim.register("job", hang)
        recorder = Recorder(victim)
        await victim.start()
        await advance_until(fake_clock, lambda r=recorder: r.counts["claimed"] >= 1, step=STEP, limit=60)  # type: ignore[misc]
        await crash_consumer(victim)

    survivor = consumer(make_driver(fake_clock), "survivor", fake_clock)
    survivor.register("job", hang)
    recorder = Recorder(survivor)
    await survivor.start()

    async def failed() -> bool:
        return (await publisher.get("t1")).status is TaskStatus.FAILED

    await advance_until(fake_clock, failed, step=STEP, limit=60)
    await survivor.stop()
    info = await publisher.get("t1")
    assert [w.status.value for w in info.worker_states] == ["lost", "lost"]
    assert info.fail_cnt == 2
    assert info.last_error is not None and info.last_error.type == "LeaseExpired"
    assert recorder.counts["claimed"] == 0, "a task whose budget is used is not claimed again"
