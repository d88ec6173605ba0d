"""A consumer stalls longer than its lease (``FaultyDriver.freeze``: its storage calls hang).

Meanwhile another consumer marks the lease lost and takes the task over. When the stalled one
comes back, the store's fencing (worker id + attempt token + a running entry) refuses whatever it
sends: its ping reports the lease lost, its handler is cancelled, and a late outcome is rejected.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.testing.faults import FaultyDriver
from tests.helpers import Recorder, as_driver, wait_until
from tests.scenarios.harness import advance, advance_until, running_entries, settle

WORKER_TIMEOUT = timedelta(seconds=5)
# retry_delay 0: a lost lease is retried at once (lost leases wait the retry policy's delay too)
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=WORKER_TIMEOUT, retry_delay=timedelta(0)
)
POLL = 1.0
STEP = 0.25


class Scene:
    """Consumer A (on a FaultyDriver, the one that stalls) holds t1; consumer B waits to take over."""

    def __init__(self, make_driver: Any, clock: FakeClock) -> None:
        self.clock = clock
        self.store = make_driver(clock)
        self.publisher = Publisher(self.store, clock=clock)
        self.a_driver = FaultyDriver(self.store)
        self.a = self._consumer(self.a_driver, "A")
        self.b = self._consumer(make_driver(clock), "B")
        self.recorder = Recorder(self.a, self.b)
        self.release = {"A": asyncio.Event(), "B": asyncio.Event()}
        self.cancelled: list[str] = []
        self.active: set[str] = set()
        self.overlap = 0

    def _consumer(self, driver: Any, worker_id: str) -> Consumer:
        consumer = Consumer(
            driver, worker_id=worker_id, clock=self.clock, poll_interval=POLL, claim_lease=WORKER_TIMEOUT
        )
        consumer.register("job", self.work)
        return consumer

    async def work(self, params: Any, ctx: TaskContext) -> str:
        self.active.add(ctx.worker_id)
        self.overlap = max(self.overlap, len(self.active))
        try:
            await self.release[ctx.worker_id].wait()
        except asyncio.CancelledError:
            self.cancelled.append(ctx.worker_id)
            raise
        finally:
            self.active.discard(ctx.worker_id)
        return ctx.worker_id

    def claimed(self, worker_id: str) -> bool:
        return any(w == worker_id for w, _ in self.recorder.of("claimed"))

    async def start_with_a_holding_the_task(self) -> None:
        await self.publisher.send(Task("t1", "job", option=OPTION))
        await self.a.start()
        await self.recorder.wait("claimed")
        await advance(self.clock, 1.0)  # one ping: A's lease is now worker_timeout long
        await self.b.start()

    async def stall_until_b_takes_over(self) -> float:
        self.a_driver.freeze()
        return await advance_until(self.clock, lambda: self.claimed("B"), step=STEP, limit=60)

    async def stop(self) -> None:
        for event in self.release.values():
            event.set()
        await self.a.stop(grace=0)
        await self.b.stop(grace=0)


async def test_stalled_consumer_notices_at_its_next_ping_and_writes_nothing(
    make_driver, fake_clock: FakeClock
) -> None:
    scene = Scene(make_driver, fake_clock)
    await scene.start_with_a_holding_the_task()
    took = await scene.stall_until_b_takes_over()
    assert took <= WORKER_TIMEOUT.total_seconds() + POLL + STEP
    doc = await scene.store.get_task("t1")
    assert [e["worker_id"] for e in running_entries(doc)] == ["B"], "one live lease: B's"
    # A's ping hangs, but A stopped trusting its lease at the lease's known end: its handler
    # was cancelled before B took over, so the work never ran twice at once.
    assert scene.cancelled == ["A"]
    assert scene.overlap == 1
    finishes_before = scene.a_driver.calls["finish"]

    scene.a_driver.unfreeze()  # A's hung ping goes through now, with its old time
    await scene.recorder.wait("lost")
    await scene.recorder.wait("finished")  # A's handler ended (cancelled)
    await settle()
    assert [w for w, _ in scene.recorder.of("lost")] == ["A"]
    assert scene.cancelled == ["A"]
    assert scene.a_driver.calls["finish"] == finishes_before, "a lost attempt writes no outcome"
    assert await scene.store.get_task("t1") == doc, "A changed nothing in the store"
    assert scene.a.running_count == 0

    scene.release["B"].set()
    await scene.recorder.wait("finished", 2)
    await scene.stop()
    info = await scene.publisher.get("t1")
    assert info.status is TaskStatus.SUCCEEDED
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [("A", "lost"), ("B", "succeeded")]
    assert info.success_cnt == 1 and info.results == ["B"]


async def test_outcome_of_a_stalled_consumer_is_refused(make_driver, fake_clock: FakeClock) -> None:
    """A's handler returns in time, but its success is stuck in the stall and arrives after B
    took over: rejected. (A handler still running at its lease end is cancelled instead, see the
    test above.)"""
    scene = Scene(make_driver, fake_clock)
    await scene.start_with_a_holding_the_task()
    scene.a_driver.freeze()
    finishes = scene.a_driver.calls["finish"]
    scene.release["A"].set()  # A's handler returns; its finish hangs in the frozen driver
    await wait_until(lambda: scene.a_driver.calls["finish"] == finishes + 1, what="A's finish to hang")
    await advance_until(fake_clock, lambda: scene.claimed("B"), step=STEP, limit=60)
    assert scene.cancelled == [], "a handler that already returned is not cancelled"
    before = await scene.store.get_task("t1")
    scene.a_driver.unfreeze()
    await scene.recorder.wait("finished")
    ((worker, data),) = scene.recorder.of("finished")
    assert (worker, data["outcome"]) == ("A", "lost"), "the store refused A's late success"
    assert await scene.store.get_task("t1") == before
    assert scene.a.stats["succeeded"] == 0

    scene.release["B"].set()
    await scene.recorder.wait("finished", 2)
    await scene.stop()
    info = await scene.publisher.get("t1")
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [("A", "lost"), ("B", "succeeded")]
    assert info.results == ["B"], "success recorded once, by the lease holder"


async def test_handler_stops_at_its_lease_end_while_pings_hang(make_driver, fake_clock: FakeClock) -> None:
    """The River / Kleppmann rule: stop trusting a lease at its known end, reply or no reply."""
    scene = Scene(make_driver, fake_clock)
    await scene.start_with_a_holding_the_task()
    await scene.stall_until_b_takes_over()
    try:
        assert scene.overlap == 1, f"{scene.overlap} handlers ran t1 at the same time"
    finally:
        scene.a_driver.unfreeze()
        await scene.stop()


async def test_a_late_write_lands_only_if_nobody_marked_the_lease_lost(
    make_driver, fake_clock: FakeClock
) -> None:
    """The documented edge of the fence: the store judges a write by the ``now`` the worker put in
    it (no ``$$NOW``, see docs/guarantees.md) and by its entry still running. A success computed
    in time but delayed past the lease lands if no other worker marked the lease lost meanwhile;
    nobody else can hold the slot then (a takeover must mark it lost first), so nothing is
    overwritten. The stall tests above show the other order: refused."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a = Consumer(
        as_driver(a_driver), worker_id="A", clock=fake_clock, poll_interval=POLL, claim_lease=WORKER_TIMEOUT
    )
    release = asyncio.Event()

    async def work(params: Any) -> str:
        await release.wait()
        return "late"

    a.register("job", work)
    recorder = Recorder(a)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    a_driver.freeze()
    release.set()  # the handler returns in time; its finish waits in the frozen driver
    await wait_until(lambda: a_driver.calls["finish"] == 1, what="the finish to wait in the frozen driver")
    fake_clock.advance(3 * WORKER_TIMEOUT.total_seconds())  # no other consumer marks it lost
    a_driver.unfreeze()
    await recorder.wait("finished")
    await a.stop(grace=0)
    info = await publisher.get("t1")
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [("A", "succeeded")]
