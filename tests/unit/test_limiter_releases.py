"""The release of an ended attempt's slot rides on the next acquire of its limit (issue 18: commands
per task with a limit that is never reached).

A release in a write of its own per finish batch is a second write per claim round on the limit's
document. The Limiter keeps them for the next acquire of that limit by the same worker
(``AcquireParams.release``) while the limit was at most half full at its last acquire and nobody
waits for it, for at most ``RELEASE_HOLD`` (half a slot lease while it has room for a reserve);
otherwise they go at once, as before. Held slots only make a limit stricter.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from mscheduler import Consumer, FakeClock, Operations, Publisher, Task, TaskOption
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import ClaimParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.runtime.consumer.limiter import RELEASE_HOLD, Limiter
from mscheduler.testing.faults import FaultyDriver
from tests.helpers import as_driver
from tests.scenarios.harness import advance, advance_until

SLOT_LEASE = timedelta(seconds=30)


class Setup:
    def __init__(self, clock: FakeClock, max_running: int, *, reserve: bool = False) -> None:
        self.clock = clock
        self.store = MemoryDriver(clock=clock)
        self.driver = FaultyDriver(self.store)
        self.limiter = Limiter(
            as_driver(self.driver),
            refresh=60,
            backoff=1,
            slot_lease=SLOT_LEASE,
            rng=random.Random(0),
            reserve=reserve,
        )
        self.max_running = max_running
        self.n = 0

    async def start(self, tasks: int = 40) -> None:
        await Operations(self.store, clock=self.clock).set_limit("job", max_running=self.max_running)
        await Publisher(self.store, clock=self.clock).send_many(
            [Task(f"t{i:03}", "job") for i in range(tasks)]
        )
        await self.limiter.maybe_refresh(["job"], 0.0)

    async def claim(self, n: int) -> list[str]:
        attempts = [f"a{self.n + i}" for i in range(n)]
        self.n += n
        params = ClaimParams("w1", ["job"], self.clock.now(), attempts)
        return [task.attempt for task in await self.limiter.claim(params, self.driver.claim)]

    async def live(self) -> list[str]:
        doc = await self.store.get_limit("job")
        assert doc is not None
        return sorted(a for a, s in doc["slots"].items() if s["e"] > self.clock.now())

    def end(self, *attempts: str) -> None:
        for attempt in attempts:
            self.limiter.release("job", "w1", attempt)


async def test_a_release_waits_for_the_next_acquire_and_goes_with_it(fake_clock: FakeClock) -> None:
    s = Setup(fake_clock, max_running=100)
    await s.start()
    first = await s.claim(2)
    s.end(*first)
    assert await s.limiter.flush(fake_clock.now()) is True
    assert s.driver.calls["update_slots"] == 0  # held: the limit is far from full
    assert await s.live() == first
    second = await s.claim(2)
    assert s.driver.calls["update_slots"] == 0 and s.driver.calls["acquire_slots"] == 2
    assert await s.live() == second  # the acquire released the first two
    assert not s.limiter.releases


async def test_a_release_goes_at_once_when_the_limit_is_more_than_half_full(fake_clock: FakeClock) -> None:
    s = Setup(fake_clock, max_running=3)
    await s.start()
    claimed = await s.claim(2)  # 2 of 3: more than half
    s.end(claimed[0])
    await s.limiter.flush(fake_clock.now())
    assert s.driver.calls["update_slots"] == 1
    assert await s.live() == claimed[1:]


async def test_a_release_goes_at_once_when_the_limit_refused(fake_clock: FakeClock) -> None:
    s = Setup(fake_clock, max_running=2)
    await s.start()
    claimed = await s.claim(2)
    assert await s.claim(1) == []  # refused: somebody (this worker) waits for a slot
    s.end(claimed[0])
    await s.limiter.flush(fake_clock.now())
    assert s.driver.calls["update_slots"] == 1 and await s.live() == claimed[1:]


@pytest.mark.parametrize("reserve", [False, True])
async def test_a_held_release_goes_once_its_hold_ran_out(fake_clock: FakeClock, reserve: bool) -> None:
    s = Setup(fake_clock, max_running=1000, reserve=reserve)
    await s.start()
    await s.claim(2)  # learns that the limit has room (for a reserve too)
    claimed = await s.claim(2)
    s.end(*claimed)
    hold = SLOT_LEASE / 2 if reserve else RELEASE_HOLD  # as long as a reserved grant is kept
    assert s.limiter.release_due_in(fake_clock.now()) == 0  # not looked at yet
    await s.limiter.flush(fake_clock.now())
    assert s.limiter.release_due_in(fake_clock.now()) == hold.total_seconds()
    fake_clock.advance(hold - timedelta(milliseconds=1))
    assert not s.limiter.any_due(fake_clock.now())  # the finisher starts no flush for it
    await s.limiter.flush(fake_clock.now())
    assert s.driver.calls["update_slots"] == 0
    fake_clock.advance(timedelta(milliseconds=1))
    assert s.limiter.release_due_in(fake_clock.now()) == 0 and s.limiter.any_due(fake_clock.now())
    await s.limiter.flush(fake_clock.now())
    assert s.driver.calls["update_slots"] == 1 and s.limiter.commands["release_held"] == 1
    assert not set(claimed) & set(await s.live())


async def test_everything_goes_at_stop(fake_clock: FakeClock) -> None:
    s = Setup(fake_clock, max_running=100)
    await s.start()
    claimed = await s.claim(3)
    s.end(*claimed)
    await s.limiter.flush(fake_clock.now())
    assert await s.limiter.flush(fake_clock.now(), everything=True) is True
    assert s.driver.calls["update_slots"] == 1 and await s.live() == []


async def test_a_failed_acquire_keeps_the_releases_it_carried(fake_clock: FakeClock) -> None:
    s = Setup(fake_clock, max_running=100)
    await s.start()
    first = await s.claim(2)
    s.end(*first)
    await s.limiter.flush(fake_clock.now())
    s.driver.fail_next("acquire_slots")
    with pytest.raises(StorageError):
        await s.claim(2)
    assert s.limiter.releases == {("job", "w1"): first}
    await s.limiter.flush(fake_clock.now(), everything=True)
    assert await s.live() == []


async def test_a_consumer_under_a_limit_never_reached_writes_no_release_of_its_own(
    fake_clock: FakeClock,
) -> None:
    """A consumer working off 200 tasks under max_running=1000: the slots of ended attempts go
    with the acquires (one per 4 claim rounds: the reserve), none in a write of its own; the
    last ones go once their hold ran out, or at stop."""
    store = MemoryDriver(clock=fake_clock)
    await Operations(store, clock=fake_clock).set_limit("job", max_running=1000)
    driver = FaultyDriver(store)
    consumer = Consumer(as_driver(driver), worker_id="c1", clock=fake_clock, concurrency=10, planner=False)
    done: list[str] = []

    async def handler(params: dict[str, int]) -> None:
        await fake_clock.sleep(0.05)
        done.append(str(params["i"]))

    consumer.register("job", handler)
    option = TaskOption(ping_interval=timedelta(seconds=10))
    tasks = [Task(f"t{i:03}", "job", {"i": i}, option=option) for i in range(200)]
    await Publisher(store, clock=fake_clock).send_many(tasks)
    async with consumer:
        await advance_until(fake_clock, lambda: len(done) == 200, step=0.05)
        assert driver.calls["update_slots"] == 0, driver.calls
        assert driver.calls["acquire_slots"] < 10, driver.calls  # about one per 4 claim rounds
        held = consumer.limiter.releases
        assert held  # the last rounds' slots wait for an acquire that will not come
        # one timer wakes the finisher when they fall due (not a sleep of its own per loop turn)
        timer = consumer._hold_timer
        assert timer is not None and not timer.done()
        await advance(fake_clock, (SLOT_LEASE / 2).total_seconds() + 1, step=0.5)
        assert not consumer.limiter.releases and driver.calls["update_slots"] >= 1
    doc = await store.get_limit("job")
    assert doc is not None and not [a for a, s in doc["slots"].items() if s["e"] > fake_clock.now()]


async def test_grants_a_limited_claim_did_not_use_go_to_the_unlimited_names(fake_clock: FakeClock) -> None:
    """A limit over a name with no due task granted every attempt; the claim of the unlimited
    names still gets them all (it once got none: one limited name without work held a consumer
    to a claim or so per wake-up)."""
    store = MemoryDriver(clock=fake_clock)
    await Operations(store, clock=fake_clock).set_limit("rare", max_running=100)
    await Publisher(store, clock=fake_clock).send_many([Task(f"t{i}", "job") for i in range(5)])
    limiter = Limiter(store, refresh=60, backoff=1, slot_lease=SLOT_LEASE, rng=random.Random(0), reserve=True)
    await limiter.maybe_refresh(["job", "rare"], 0.0)
    params = ClaimParams("w1", ["job", "rare"], fake_clock.now(), [f"a{i}" for i in range(5)])
    claimed = await limiter.claim(params, store.claim)
    assert sorted(task.key for task in claimed) == [f"t{i}" for i in range(5)]
    assert len({task.attempt for task in claimed}) == 5


async def test_a_claim_from_reserved_grants_starts_no_more_tasks_than_it_asked_for(
    fake_clock: FakeClock,
) -> None:
    """With grants in reserve, a claim round's limited claim uses them and the unlimited names
    get only the attempts left over: never more tasks than the round asked for (it once started
    up to twice as many: past the consumer's concurrency, and its claimer, seeing a reply larger
    than asked, forgot what was due and waited for the next wake-up)."""
    store = MemoryDriver(clock=fake_clock)
    await Operations(store, clock=fake_clock).set_limit("job", max_running=1000)
    await Publisher(store, clock=fake_clock).send_many(
        [Task(f"{name}{i:02}", name) for name in ("job", "free") for i in range(40)]
    )
    limiter = Limiter(store, refresh=60, backoff=1, slot_lease=SLOT_LEASE, rng=random.Random(0), reserve=True)
    await limiter.maybe_refresh(["job", "free"], 0.0)
    sizes = []
    for round_no in range(6):
        attempts = [f"r{round_no}a{i}" for i in range(2)]
        params = ClaimParams("w1", ["free", "job"], fake_clock.now(), attempts)
        sizes.append(len(await limiter.claim(params, store.claim)))
    assert limiter.reserve  # the rounds above did use reserved grants
    assert sizes == [2] * 6
