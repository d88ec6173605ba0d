"""Flow limits under load (SPEC G5), on a FakeClock: many consumers racing for few slots.

* 20 consumers, ``max_running=3`` for one name, 1,000 tasks (and crashes): the observed peak is
  exactly 3, never more, the slots stay in use (throughput near 3 / task duration), every task
  ends succeeded, and an unlimited name is not held up.
* ``rate="50/s"`` over a simulated minute: no 1-second window holds more than 50 starts (checked
  on the stored start times), and the throughput is within 10 % of the rate.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from datetime import datetime, timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Operations, Publisher, Task, TaskContext, TaskOption
from mscheduler.domain.listing import ListParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from mscheduler.testing.mongomock import mongomock_database
from tests.helpers import as_driver
from tests.scenarios.harness import advance, advance_until

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=5), retry_delay=timedelta(0)
)


def consumers(store: Any, n: int, clock: FakeClock, **kwargs: Any) -> list[Consumer]:
    made = []
    for i in range(n):
        made.append(
            Consumer(
                as_driver(FaultyDriver(store)),
                worker_id=f"c{i:02d}",
                clock=clock,
                poll_interval=1.0,
                planner=False,
                claim_lease=timedelta(seconds=5),
                **kwargs,
            )
        )
    return made


async def all_tasks(store: Any, name: str | None = None) -> list[dict[str, Any]]:
    return await store.list_tasks(ListParams(name=name, limit=100_000))


async def live_slots(store: Any, key: str, now: datetime) -> int:
    doc = await store.get_limit(key)
    return sum(1 for s in doc["slots"].values() if s["e"] > now) if doc else 0


async def test_twenty_consumers_never_run_more_than_max_running(fake_clock: FakeClock) -> None:
    store = MemoryDriver(clock=fake_clock)
    ops = Operations(store, clock=fake_clock)
    await ops.set_limit("limited", max_running=3)
    publisher = Publisher(store, clock=fake_clock)
    duration = 0.5
    active = 0
    peak = 0
    completed = 0
    busy_time = 0.0  # slot-seconds in use, sampled per step
    free_done: list[float] = []
    start = fake_clock.now()

    async def limited(params: Any, ctx: TaskContext) -> None:
        nonlocal active, peak, completed
        active += 1
        peak = max(peak, active)
        try:
            await fake_clock.sleep(duration)
            completed += 1
        finally:
            active -= 1

    async def free(params: Any) -> None:
        free_done.append((fake_clock.now() - start).total_seconds())

    group = consumers(store, 20, fake_clock, concurrency=4)
    for c in group:
        c.register("limited", limited)
        c.register("free", free)
    await publisher.send_many([Task(f"l{i}", "limited", option=OPTION) for i in range(1000)])
    await publisher.send_many([Task(f"f{i}", "free", option=OPTION) for i in range(200)])
    for c in group:
        await c.start()

    def check() -> None:
        nonlocal busy_time
        assert active <= 3, f"{active} handlers of the limited name at once"
        busy_time += active * 0.25

    async def done() -> bool:
        live = await live_slots(store, "limited", fake_clock.now())
        assert live <= 3, f"{live} live slots"
        if completed < 1000:  # handlers that returned (a crashed consumer's never do)
            return False
        return all(t["state"]["status"] == "succeeded" for t in await all_tasks(store, "limited"))

    # crash two consumers a few seconds in: their slots come back when their leases end
    await advance(fake_clock, 5.0, check=check)
    holders = {w for w, _, _ in (await ops.get_limit("limited")).holders}
    crashed = [c for c in group if c.worker_id in holders][:2]
    for c in crashed:
        await crash_consumer(c)
    took = 5.0 + await advance_until(fake_clock, done, step=0.25, limit=600, check=check)
    for c in group:
        if c not in crashed:
            await c.stop()

    assert peak == 3
    assert len(free_done) == 200 and max(free_done) < 5.0, "the unlimited name was held up"
    tasks = await all_tasks(store, "limited")
    assert len(tasks) == 1000 and all(t["state"]["status"] == "succeeded" for t in tasks)
    ideal = 1000 * duration / 3
    # crashes cost at most a lease (5 s) of two slots; the rest of the time the slots are busy
    assert took <= ideal * 1.15 + 10, f"{took:.1f} fake s for an ideal {ideal:.1f} s"
    print(f"\nmax_running=3: {took:.1f} fake s (ideal {ideal:.1f}), mean busy {busy_time / took:.2f} slots")


def max_in_window(times: list[datetime], window: timedelta) -> int:
    times = sorted(times)
    return max((bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


async def test_rate_fifty_per_second_over_a_minute(fake_clock: FakeClock) -> None:
    store = MemoryDriver(clock=fake_clock)
    ops = Operations(store, clock=fake_clock)
    await ops.set_limit("api", rate="50/s")
    publisher = Publisher(store, clock=fake_clock)
    group = consumers(store, 5, fake_clock, concurrency=20)

    async def call(params: Any) -> None:
        await asyncio.sleep(0)

    for c in group:
        c.register("api", call)
    await publisher.send_many([Task(f"a{i}", "api", option=OPTION) for i in range(4000)])
    for c in group:
        await c.start()
    await advance(fake_clock, 60.0, step=0.05)
    for c in group:
        await c.stop()
    starts = [e["start_time"] for t in await all_tasks(store, "api") for e in t["state"]["worker_states"]]
    assert max_in_window(starts, timedelta(seconds=1)) <= 50
    rate = len(starts) / 60
    print(f"\nrate 50/s: {len(starts)} starts in 60 fake s = {rate:.1f}/s")
    assert 45 <= rate <= 50 * 61 / 60


async def test_limits_through_consumers_on_mongomock(fake_clock: FakeClock) -> None:
    """The Mongo driver's path (update pipelines on the limit document) under 6 consumers."""
    from mscheduler import MongoDriver

    database = mongomock_database()
    store = MongoDriver(database)
    await store.setup()
    ops = Operations(store, clock=fake_clock)
    await ops.set_limit("db", names=["import", "export"], max_running=2)
    publisher = Publisher(store, clock=fake_clock)
    active = peak = 0

    async def work(params: Any) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            await fake_clock.sleep(0.5)
        finally:
            active -= 1

    group = consumers(store, 6, fake_clock, concurrency=3)
    for c in group:
        c.register("import", work)
        c.register("export", work)
    await publisher.send_many([Task(f"i{i}", "import", option=OPTION) for i in range(20)])
    await publisher.send_many([Task(f"e{i}", "export", option=OPTION) for i in range(20)])
    for c in group:
        await c.start()

    def check() -> None:
        assert active <= 2

    async def done() -> bool:
        return all(t["state"]["status"] == "succeeded" for t in await all_tasks(store))

    took = await advance_until(fake_clock, done, step=0.25, limit=120, check=check)
    for c in group:
        await c.stop()
    assert peak == 2
    assert took <= 40 * 0.5 / 2 * 1.5 + 2
    assert (await ops.get_limit("db")).running == 0  # every slot released with its finish


async def test_a_limited_task_with_a_long_ping_interval_keeps_its_capped_first_lease(
    fake_clock: FakeClock,
) -> None:
    """Without ``claim_lease``, a limited task's first lease is still capped at the slot's lease
    (30 s): the pinger must renew it within a third of that, not at the task's own 40 s
    ``ping_interval``, or the lease is lost before the first ping."""
    store = MemoryDriver(clock=fake_clock)
    await Operations(store, clock=fake_clock).set_limit("slow", max_running=1)
    option = TaskOption(ping_interval=timedelta(seconds=40), worker_timeout=timedelta(seconds=120))
    await Publisher(store, clock=fake_clock).send(Task("long", "slow", option=option))
    consumer = Consumer(store, worker_id="c", clock=fake_clock, poll_interval=1.0, planner=False)

    async def handle(params: Any, ctx: TaskContext) -> str:
        await fake_clock.sleep(60)
        return "done"

    consumer.register("slow", handle)
    await consumer.start()
    try:

        async def ended() -> bool:
            doc = await store.get_task("long")
            return doc is not None and doc["state"]["status"] in ("succeeded", "failed")

        await advance_until(fake_clock, ended, step=1.0, limit=120)
    finally:
        await consumer.stop(grace=0)
    doc = await store.get_task("long")
    assert doc is not None
    assert [e["status"] for e in doc["state"]["worker_states"]] == ["succeeded"]
