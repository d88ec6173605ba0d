"""Workers whose clocks are an hour off (SPEC G1): leases are computed on the server's clock.

Each consumer's ``ServerClock`` estimates its offset from the store's time at start (``hello``'s
``localTime`` on MongoDB; here ``ServerTime`` plays it, since mongomock has no ``hello``), so a
worker an hour fast does not think a live lease expired, and one an hour slow does not write
leases that are already over. Without that correction (a server that cannot tell its time), the
fast worker takes a live lease over: fencing still keeps the store consistent, but the handler
runs twice at once until the old holder's next ping.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.testing.clock import SkewedClock
from tests.helpers import Recorder
from tests.scenarios.harness import ServerTime, advance, advance_until, running_entries

HOUR = timedelta(hours=1)
WORKER_TIMEOUT = timedelta(seconds=5)
# retry_delay 0: a lost lease is retried at once (lost leases wait the retry policy's delay too)
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=WORKER_TIMEOUT, retry_delay=timedelta(0)
)


class Scene:
    def __init__(self, make_driver: Any, clock: FakeClock, *, server_tells_time: bool) -> None:
        self.clock = clock
        self.store = make_driver(clock)
        self.make_driver = make_driver
        self.server_clock = clock if server_tells_time else None
        self.publisher = Publisher(self.store, clock=clock)  # the publisher's clock is right
        self.release = asyncio.Event()
        self.active: set[str] = set()
        self.peak = 0
        self.cancelled: list[str] = []
        self.recorder = Recorder()

    def consumer(self, worker_id: str, skew: timedelta) -> Consumer:
        driver = ServerTime(self.make_driver(self.clock), self.server_clock)
        c = Consumer(
            driver,
            worker_id=worker_id,
            clock=SkewedClock(self.clock, skew),
            poll_interval=1.0,
            claim_lease=WORKER_TIMEOUT,
        )
        c.register("job", self.work)
        self.recorder.attach(c)
        return c

    async def work(self, params: Any, ctx: TaskContext) -> str:
        self.active.add(ctx.worker_id)
        self.peak = max(self.peak, len(self.active))
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(ctx.worker_id)
            raise
        finally:
            self.active.discard(ctx.worker_id)
        return ctx.worker_id


@pytest.mark.parametrize(
    ("holder_skew", "other_skew"), [(-HOUR, HOUR), (HOUR, -HOUR)], ids=["holder-slow", "holder-fast"]
)
async def test_an_hour_of_skew_either_way_gives_no_double_ownership(
    make_driver, fake_clock: FakeClock, holder_skew: timedelta, other_skew: timedelta
) -> None:
    scene = Scene(make_driver, fake_clock, server_tells_time=True)
    holder = scene.consumer("holder", holder_skew)
    other = scene.consumer("other", other_skew)
    await scene.publisher.send(Task("t1", "job", option=OPTION))
    await holder.start()
    await scene.recorder.wait("claimed")
    await other.start()
    for c, skew in ((holder, holder_skew), (other, other_skew)):
        assert abs(c.clock.offset + skew) <= timedelta(milliseconds=1), (c.worker_id, c.clock.offset)
        assert abs(c.clock.now() - fake_clock.now()) <= timedelta(milliseconds=1)

    async def one_owner() -> None:
        doc = await scene.store.get_task("t1")
        assert [e["worker_id"] for e in running_entries(doc)] == ["holder"]

    for _ in range(3 * int(WORKER_TIMEOUT.total_seconds())):  # three leases' worth of time
        await advance(fake_clock, 1.0)
        await one_owner()
    assert scene.recorder.counts["lost"] == 0
    assert scene.peak == 1

    scene.release.set()
    await scene.recorder.wait("finished")
    await scene.publisher.send(Task("t2", "job", option=OPTION))  # due now, on the right clock
    await advance_until(fake_clock, lambda: scene.recorder.counts["finished"] >= 2, limit=5)
    await holder.stop(grace=0)
    await other.stop(grace=0)
    t1 = await scene.publisher.get("t1")
    assert [(w.worker_id, w.status.value) for w in t1.worker_states] == [("holder", "succeeded")]
    assert (await scene.publisher.get("t2")).status is TaskStatus.SUCCEEDED


async def test_without_the_server_clock_a_fast_worker_takes_a_live_lease(
    make_driver, fake_clock: FakeClock
) -> None:
    """What the correction prevents (and mongomock, which has no server time, would let happen)."""
    scene = Scene(make_driver, fake_clock, server_tells_time=False)
    holder = scene.consumer("holder", timedelta(0))
    fast = scene.consumer("fast", HOUR)
    await scene.publisher.send(Task("t1", "job", option=OPTION))
    await holder.start()
    await scene.recorder.wait("claimed")
    await advance(fake_clock, 1.0)  # the holder pings: its lease is live for 5 more seconds
    assert fast.clock.offset == timedelta(0), "nothing to correct with"
    await fast.start()  # its first poll thinks the holder's lease ended an hour ago
    await advance_until(fake_clock, lambda: scene.recorder.counts["claimed"] >= 2, limit=2)
    assert scene.peak == 2, "two handlers ran t1 at once"
    await advance_until(fake_clock, lambda: scene.cancelled == ["holder"], limit=2)  # its next ping
    scene.release.set()
    await advance_until(fake_clock, lambda: scene.recorder.counts["finished"] >= 2, limit=5)
    await holder.stop(grace=0)
    await fast.stop(grace=0)
    info = await scene.publisher.get("t1")
    # Fencing still holds: the store has one success, by the worker that held the lease there.
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [
        ("holder", "lost"),
        ("fast", "succeeded"),
    ]


async def test_a_wall_clock_step_between_syncs_does_not_take_a_live_lease(
    make_driver, fake_clock: FakeClock
) -> None:
    scene = Scene(make_driver, fake_clock, server_tells_time=True)
    holder = scene.consumer("holder", timedelta(0))
    jumper = scene.consumer("jumper", timedelta(0))
    jumper_clock = jumper.clock.base
    assert isinstance(jumper_clock, SkewedClock)
    await scene.publisher.send(Task("t1", "job", option=OPTION))
    await holder.start()
    await scene.recorder.wait("claimed")
    await jumper.start()
    jumper_clock.skew = HOUR  # NTP steps the jumper's machine clock an hour ahead
    try:
        await advance(fake_clock, 3.0)  # less than a lease, far less than a resync
        assert scene.peak == 1, "the jumper took a live lease over"
    finally:
        scene.release.set()
        await holder.stop(grace=0)
        await jumper.stop(grace=0)
