"""Change-stream faults: events dropped, duplicated, reordered, streams broken or invalidated.

Events are hints (SPEC F5; reliability anchors 1.5): the claim re-checks everything atomically, and
polling is the floor. So whatever the stream does, no task is lost and none runs twice at once.
On the memory driver the faults are applied to its real event stream; on mongomock (no change
streams) to a simulated one that reports each write, as MongoDB's ``updateLookup`` would.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.testing.faults import STREAM, FaultyDriver
from tests.helpers import Recorder, as_driver
from tests.scenarios.harness import EndingStream, Overlap, StreamBus, advance, advance_until, with_stream

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=5), retry_delay=timedelta(seconds=2)
)
STREAM_POLL = 30.0  # while a stream is healthy, polling is rare: the stream does the work


async def test_nothing_lost_nothing_run_twice_whatever_the_stream_does(
    make_driver, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    bus = StreamBus()
    publisher = Publisher(with_stream(store, bus), clock=fake_clock)
    overlap = Overlap()
    failed_once: set[str] = set()
    consumers: list[Consumer] = []
    drivers: list[FaultyDriver] = []
    for n in range(3):
        inner = with_stream(make_driver(fake_clock), bus)
        if n == 2:  # this one's streams end by themselves every few events, as after an invalidate
            inner = EndingStream(inner, end_every=4)
        driver = FaultyDriver(inner)
        driver.set_stream_faults(drop_every=3 + n, duplicate_every=4, reorder_window=3 if n != 1 else 0)
        drivers.append(driver)
        c = Consumer(
            as_driver(driver),
            worker_id=f"w{n}",
            clock=fake_clock,
            concurrency=2,
            poll_interval=1.0,
            stream_poll_interval=STREAM_POLL,
        )

        async def work(params: Any, ctx: TaskContext) -> int:
            overlap.enter(ctx.key, ctx.worker_id)
            try:
                await fake_clock.sleep(0.5 + params["n"] % 4)
                if params["n"] % 5 == 0 and ctx.key not in failed_once:
                    failed_once.add(ctx.key)
                    raise RuntimeError("first try fails: a retry wake-up must be found")
            finally:
                overlap.leave(ctx.key, ctx.worker_id)
            return int(params["n"])

        c.register("job", work)
        consumers.append(c)
    recorder = Recorder(*consumers)
    for c in consumers:
        await c.start()

    cnt = {i: 2 if i % 3 == 0 else 1 for i in range(30)}
    for i in range(30):  # published while the consumers watch, a few at a time
        option = OPTION.model_copy(update={"concurrent_worker_cnt": cnt[i]})
        await publisher.send(Task(f"t{i}", "job", {"n": i}, option=option))
        if i % 5 == 4:
            await advance_until(fake_clock, lambda: True)
            fake_clock.advance(0.5)

    steps = [0]

    def break_now_and_then() -> None:
        steps[0] += 1
        if steps[0] % 16 == 0:
            drivers[steps[0] // 16 % 3].break_stream()

    async def all_done() -> bool:
        return (await store.count_by_status()).get("succeeded", 0) == 30

    await advance_until(fake_clock, all_done, limit=600, check=break_now_and_then)
    for c in consumers:
        assert c.error is None, c.error
        await c.stop(grace=0)

    kinds = {f.detail for d in drivers for f in d.faults if f.kind == STREAM}
    assert {"dropped", "duplicated", "reordered", "broken"} <= kinds, kinds
    assert recorder.counts["stream_broken"] >= 1
    assert recorder.counts["stream_unsupported"] == 0, "every consumer watched"
    for i in range(30):
        key = f"t{i}"
        info = await publisher.get(key)
        assert info.status is TaskStatus.SUCCEEDED
        assert info.success_cnt == cnt[i]
        assert len({w.worker_id for w in info.worker_states if w.status.value == "succeeded"}) == cnt[i]
        assert overlap.peak[key] <= cnt[i], f"{key} ran {overlap.peak[key]} times at once"
        assert overlap.runs[key] == cnt[i] + info.fail_cnt, "re-run only after a failure"
    assert overlap.same_worker_twice == []


async def test_a_stream_that_keeps_ending_at_once_does_not_spin(make_driver, fake_clock: FakeClock) -> None:
    """An invalidated stream is reopened with backoff (and a poll), not in a tight loop that would
    starve the event loop."""
    store = make_driver(fake_clock)
    bus = StreamBus()
    publisher = Publisher(with_stream(store, bus), clock=fake_clock)
    ending = EndingStream(with_stream(make_driver(fake_clock), bus), end_every=0)
    c = Consumer(ending, worker_id="w", clock=fake_clock, poll_interval=1.0, stream_poll_interval=STREAM_POLL)

    async def work(params: Any) -> None:
        return None

    c.register("job", work)
    await publisher.send_many([Task(f"t{i}", "job", option=OPTION) for i in range(3)])
    async with c:

        async def all_done() -> bool:
            return (await store.count_by_status()).get("succeeded", 0) == 3

        await advance_until(fake_clock, all_done, limit=30)
        opened = ending.opened
        await advance(fake_clock, 10.0)
        assert c.error is None, c.error
    reopened = ending.opened - opened
    assert 2 <= reopened <= 10, f"reopened {reopened} times in 10 fake seconds (backoff doubles)"
