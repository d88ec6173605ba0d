"""Graceful stop (SPEC F9): stop claiming, keep pinging while handlers finish within the grace
period (on the consumer's clock), then cancel and release. Released attempts use no retry."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from tests.helpers import Recorder
from tests.scenarios.harness import advance, advance_until, running_entries, settle

WORKER_TIMEOUT = timedelta(seconds=5)
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=WORKER_TIMEOUT, max_unexpected_retries=0
)
POLL = 1.0


def consumer(driver: Any, worker_id: str, clock: FakeClock) -> Consumer:
    return Consumer(driver, worker_id=worker_id, clock=clock, poll_interval=POLL, claim_lease=WORKER_TIMEOUT)


async def test_graceful_stop_lets_the_handler_finish_and_keeps_its_lease(
    make_driver, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a = consumer(store, "A", fake_clock)
    b = consumer(make_driver(fake_clock), "B", fake_clock)
    release = asyncio.Event()

    async def work(params: Any, ctx: TaskContext) -> str:
        if ctx.key == "t1":
            await release.wait()
        return ctx.worker_id

    a.register("job", work)
    b.register("job", work)
    recorder = Recorder(a, b)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    await b.start()
    stopping = asyncio.create_task(a.stop(grace=60))
    await settle()
    await publisher.send(Task("t2", "job", option=OPTION))

    async def only_a_holds_t1() -> None:
        assert [e["worker_id"] for e in running_entries(await store.get_task("t1"))] == ["A"]

    for _ in range(3 * int(WORKER_TIMEOUT.total_seconds())):  # 15 s: three leases' worth
        await advance(fake_clock, 1.0)
        await only_a_holds_t1()
    assert recorder.counts["lost"] == 0, "A kept pinging during the grace period"
    assert not stopping.done()
    assert [w for w, d in recorder.of("claimed") if d["key"] == "t2"] == ["B"], "A claims nothing new"

    release.set()
    await asyncio.wait_for(stopping, 5)
    await b.stop()
    t1 = await publisher.get("t1")
    assert [(w.worker_id, w.status.value) for w in t1.worker_states] == [("A", "succeeded")]
    assert (await publisher.get("t2")).results == ["B"]


async def test_after_the_grace_period_the_lease_is_released_and_no_retry_is_used(
    make_driver, fake_clock: FakeClock
) -> None:
    """max_unexpected_retries=0, two consumers stopped mid-task: the task still runs on a third."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    cancelled: list[str] = []

    async def work(params: Any, ctx: TaskContext) -> str:
        if ctx.worker_id != "C":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(ctx.worker_id)
                raise
        return "done"

    await publisher.send(Task("t1", "job", option=OPTION))
    for worker_id in ("A", "B"):
        c = consumer(make_driver(fake_clock), worker_id, fake_clock)
        c.register("job", work)
        recorder = Recorder(c)
        await c.start()
        await advance_until(fake_clock, lambda r=recorder: r.counts["claimed"] >= 1, limit=10)  # type: ignore[misc]
        stopping = asyncio.create_task(c.stop(grace=3))
        took = await advance_until(fake_clock, stopping.done, limit=10)
        assert 3 <= took <= 3.5, took
        await stopping
        info = await publisher.get("t1")
        assert info.status is TaskStatus.PENDING
        assert info.fail_cnt == 0 and info.claim_at is not None

    assert cancelled == ["A", "B"]
    c = consumer(make_driver(fake_clock), "C", fake_clock)
    c.register("job", work)
    recorder = Recorder(c)
    async with c:
        await advance_until(fake_clock, lambda: recorder.counts["finished"] >= 1, limit=10)
    info = await publisher.get("t1")
    assert info.status is TaskStatus.SUCCEEDED
    assert [w.status.value for w in info.worker_states] == ["released", "released", "succeeded"]
    assert info.worker_states[0].error is not None and info.worker_states[0].error.type == "Cancelled"


async def test_a_second_stop_with_zero_grace_cancels_at_once(make_driver, fake_clock: FakeClock) -> None:
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a = consumer(store, "A", fake_clock)

    async def work(params: Any) -> None:
        await asyncio.Event().wait()

    a.register("job", work)
    recorder = Recorder(a)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    graceful = asyncio.create_task(a.stop(grace=3600))
    await settle()
    assert not graceful.done()
    await asyncio.wait_for(a.stop(grace=0), 5)  # no fake time passes: it does not wait for the grace
    await asyncio.wait_for(graceful, 5)
    await a.stop()  # idempotent
    assert [d["outcome"] for _, d in recorder.of("finished")] == ["released"]
    info = await publisher.get("t1")
    assert [w.status.value for w in info.worker_states] == ["released"]
    assert info.status is TaskStatus.PENDING
