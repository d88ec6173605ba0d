"""The poller never spins: however often a poll is asked for and whatever is due, a consumer polls
at most ``POLLS_PER_INTERVAL`` times per poll interval (plus the one at the window's edge), counted
on a fake clock moved in small steps (every step lets the consumer run as long as it wants).

What made one spin: its wake-up queue had overflowed (more wake-ups than it keeps), so after a
claim that came back short the claimer asked for a poll; the poll queued again a wake-up that was
due but that the claim refuses (a fan-out task this worker already ran; a task past its deadline
that another worker runs), which woke the claimer, whose claim came back short... — a poll and a
claim back to back, no fake time passing. Both are cut: a poll queues no wake-up the claim
leaves out (``exclude_keys``), the wake-up reads give no claim wake-up past a task's deadline,
and the poller spaces polls out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskOption
from mscheduler.drivers.base import ClaimParams, Driver, WakeupParams
from mscheduler.runtime.consumer.discovery import POLLS_PER_INTERVAL
from tests.conftest import DriverFactory
from tests.consumer.support import settle

STEP = 0.05  # seconds of fake time between two rounds of the loop
SECONDS = 5.0  # of fake time watched
MOST = int(SECONDS * POLLS_PER_INTERVAL) + 2  # poll interval 1 s: the bound, and the start's poll


class CountingPolls:
    """The driver, with its ``find_wakeups`` calls counted (and ``after`` run after each)."""

    def __init__(self, inner: Driver, after: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.polls = 0
        self.after = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def find_wakeups(self, params: WakeupParams) -> Any:
        self.polls += 1
        found = await self.inner.find_wakeups(params)
        if self.after is not None:
            self.after()
        return found


async def watch(clock: FakeClock, seconds: float = SECONDS) -> None:
    for _ in range(int(seconds / STEP)):
        await settle(20)
        clock.advance(timedelta(seconds=STEP))
    await settle(20)


async def consumer_on(driver: Any, clock: FakeClock, **settings: Any) -> Consumer:
    consumer = Consumer(driver, worker_id="w1", concurrency=4, clock=clock, planner=False, **settings)

    async def job(params: Any) -> None:  # on the loop: done within the turns each step settles
        return None

    consumer.register("job", job)
    return consumer


async def run_for(consumer: Consumer, clock: FakeClock, body: Callable[[], Awaitable[None]]) -> None:
    await consumer.start()
    try:
        await body()
    finally:
        await consumer.stop(grace=0)


async def test_polls_per_interval_are_bounded_whatever_asks_for_them(
    make_driver: DriverFactory, fake_clock: FakeClock
) -> None:
    """Something asks for a poll after every poll (the worst a claimer or a watcher could do):
    still at most POLLS_PER_INTERVAL per poll interval."""
    store = make_driver(fake_clock)
    await store.setup()
    holder: list[Consumer] = []

    def ask_again() -> None:
        discovery = holder[0].discovery if holder else None
        if discovery is not None:
            discovery.request_poll()

    driver = CountingPolls(store, after=ask_again)
    consumer = await consumer_on(driver, fake_clock, poll_interval=1.0)
    holder.append(consumer)
    await run_for(consumer, fake_clock, lambda: watch(fake_clock))
    assert 2 < driver.polls <= MOST, driver.polls


async def test_a_fan_out_task_this_worker_ran_does_not_make_it_poll_back_to_back(
    make_driver: DriverFactory, fake_clock: FakeClock
) -> None:
    """A fan-out task (2 workers) this worker ran is due for the other worker only; the wake-up
    queue is full of later tasks (3 kept, more arriving earlier than those): the claimer's claims
    come back short, the queue has overflowed, it asks for polls."""
    store = make_driver(fake_clock)
    await store.setup()
    driver = CountingPolls(store)
    publisher = Publisher(store, clock=fake_clock)
    await publisher.send(Task("fan", "job", option=TaskOption(concurrent_worker_cnt=2)))
    later = fake_clock.now() + timedelta(hours=1)
    await publisher.send_many([Task(f"later-{i}", "job", option=TaskOption(run_at=later)) for i in range(5)])
    consumer = await consumer_on(driver, fake_clock, poll_interval=1.0, wakeup_queue_size=3)

    async def body() -> None:
        await settle()
        sooner = fake_clock.now() + timedelta(minutes=30)
        await publisher.send_many(
            [Task(f"sooner-{i}", "job", option=TaskOption(run_at=sooner)) for i in range(3)]
        )
        await watch(fake_clock)

    await run_for(consumer, fake_clock, body)
    assert consumer.stats["succeeded"] == 1
    assert driver.polls <= SECONDS + 2, driver.polls  # one per interval: nothing asked for more


async def test_a_task_past_its_deadline_gives_no_claim_wakeup(
    make_driver: DriverFactory, fake_clock: FakeClock
) -> None:
    """A fan-out task another worker runs past its deadline keeps a free slot (claimable by its
    derived state) but is never claimed again: the wake-up read reports its deadline only."""
    store = make_driver(fake_clock)
    await store.setup()
    deadline = fake_clock.now() + timedelta(seconds=1)
    option = TaskOption(concurrent_worker_cnt=2, deadline=deadline)
    await Publisher(store, clock=fake_clock).send(Task("fan", "job", option=option))
    params = ClaimParams("w2", ["job"], fake_clock.now(), ["a1"], max_lease=timedelta(hours=1))
    assert [c.key for c in await store.claim(params)] == ["fan"]
    fake_clock.advance(timedelta(seconds=2))
    wakeups = await store.find_wakeups(WakeupParams("w1", ["job"], fake_clock.now(), 10))
    assert "claim" not in [w.kind for w in wakeups if w.key == "fan"], wakeups
    assert await store.claim(ClaimParams("w1", ["job"], fake_clock.now(), ["a2"])) == []
