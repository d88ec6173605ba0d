"""The bounded soak test: 50 consumers x 20,000 tasks on the memory driver, with faults.

Real ``Consumer`` objects in one event loop, each on its own ``FaultyDriver`` over one shared
``MemoryDriver``. Handlers fail at random (10%) and take 0.1 s to 15 s of simulated time (the long
ones outlive their 6 s lease and must be kept alive by pings). Injected faults: transient failures
of claim / finish / ping, both before they are applied and after (unknown outcomes); three
consumers are killed mid-run (``crash_consumer``: their leases are left to expire); one consumer's
storage calls freeze for 15 s — longer than its lease — and then go through with their old times.

Why a ``FakeClock`` and not the real clock with short intervals: on this 2-core machine 50
consumers and 20,000 tasks keep the one event loop busy, and with real time that load alone would
make leases expire (a loop too busy to ping in time is exactly a stall). Those lease losses would
be real but uncontrolled, so the run could not tell an injected loss from a scheduling accident,
and the duplicate check below would be flaky. With the fake clock, simulated time moves only
between ticks, after the loop has run everything that was ready: a lease is lost only through an
injected fault, and every lost lease can be checked to have a cause.

What it shows (printed at the end, then asserted):

* ``lost`` — tasks not succeeded or failed once the run is quiet: must be 0;
* ``duplicate_successes`` — handler runs that completed successfully beyond a task's
  ``concurrent_worker_cnt``. Must be 0 for every task *not touched by an injected lease loss or
  unknown outcome*, where touched means: one of its attempts ended ``lost`` (its lease expired:
  the holder was killed, frozen, had its pings fail, or never learned of its claim), or a claim or
  finish of it had its reply dropped after being applied. Touched tasks may run twice — that is
  at-least-once — and their count is printed;
* ``max_live_leases`` — sampled every simulated second over all tasks: the most running,
  unexpired entries one task had; must be <= its ``concurrent_worker_cnt`` (5% of the tasks fan
  out to 2 workers);
* every lost lease has an injected cause (``unexplained_lost_leases == 0``), no task records more
  successes than slots, and every recorded success belongs to a handler run that completed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Consumer, FakeClock, MemoryDriver, Publisher, Task, TaskContext, TaskOption
from mscheduler.domain.state import DERIVED_FIELDS
from mscheduler.testing.faults import AFTER_APPLY, FaultyDriver, crash_consumer
from tests.helpers import as_driver
from tests.oracle import expected_derived

N_CONSUMERS = 50
N_TASKS = 20_000
CONCURRENCY = 10
SEED = 20240601
STEP = 0.1  # simulated seconds per tick
YIELDS = 4  # event-loop rounds per tick: everything that became ready runs before time moves
PUBLISH_PER_TICK = 100  # 1,000 tasks per simulated second
FAN_OUT_SHARE = 0.05
FAILURE_RATE = 0.10
KILLED = ("c03", "c17", "c31")
KILL_AT = (15.0, 30.0, 45.0)  # simulated seconds
FROZEN = "c42"
FREEZE_AT, FREEZE_FOR = 25.0, 15.0
LEASE = timedelta(seconds=6)
FAULT_RATES = {  # per call, per consumer: (op, after_apply) -> probability
    ("claim", False): 0.01,
    ("claim", True): 0.005,
    ("finish", False): 0.01,
    ("finish", True): 0.005,
    ("ping", False): 0.02,
    ("ping", True): 0.01,
}
REAL_TIME_LIMIT = 240.0


@pytest.mark.soak
@pytest.mark.timeout(300)
async def test_soak_50_consumers_20000_tasks_with_faults() -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    clock = FakeClock()
    store = MemoryDriver(clock=clock)
    publisher = Publisher(store, clock=clock)
    completions: list[tuple[str, str, str]] = []  # (key, worker, attempt) of successful handler runs

    async def work(params: dict[str, Any], ctx: TaskContext) -> int:
        roll = rng.random()  # 5% long (pinged past their lease), 10% medium, the rest short
        duration = (
            rng.uniform(8, 15) if roll < 0.05 else rng.uniform(2, 5) if roll < 0.15 else rng.uniform(0.1, 2)
        )
        await clock.sleep(duration)
        if rng.random() < FAILURE_RATE:
            raise RuntimeError("random handler failure")
        completions.append((ctx.key, ctx.worker_id, ctx.attempt))
        return int(params["n"])

    drivers: dict[str, FaultyDriver] = {}
    consumers: dict[str, Consumer] = {}
    for i in range(N_CONSUMERS):
        worker_id = f"c{i:02d}"
        driver = FaultyDriver(store)
        for (op, after_apply), probability in FAULT_RATES.items():
            driver.fail_randomly(op, probability, after_apply=after_apply, seed=rng.randrange(2**32))
        consumer = Consumer(
            as_driver(driver),
            worker_id=worker_id,
            concurrency=CONCURRENCY,
            clock=clock,
            poll_interval=1.0,
            stream_poll_interval=5.0,
            heartbeat_interval=5.0,
            claim_lease=LEASE,
            grace_period=1.0,
        )
        consumer.register("soak", work)
        drivers[worker_id], consumers[worker_id] = driver, consumer
    for consumer in consumers.values():
        await consumer.start()

    normal = TaskOption(
        ping_interval=timedelta(seconds=2), worker_timeout=LEASE, retry_delay=timedelta(seconds=1)
    )
    fan_out = normal.model_copy(update={"concurrent_worker_cnt": 2})
    tasks = [
        Task(f"k{n:05d}", "soak", {"n": n}, option=fan_out if rng.random() < FAN_OUT_SHARE else normal)
        for n in range(N_TASKS)
    ]
    slots = {t.key: t.option.concurrent_worker_cnt for t in tasks}

    max_live = 0
    over_capacity: list[tuple[str, int]] = []

    def sample_live_leases() -> None:
        nonlocal max_live
        now = clock.now()
        for key, doc in store._tasks.items():  # a read-only scan of the store, for the sampler only
            if doc["state"]["running_cnt"] == 0:
                continue
            entries = doc["state"]["worker_states"]
            live = sum(1 for e in entries if e["status"] == "running" and e["ping_expire_time"] > now)
            max_live = max(max_live, live)
            if live > slots[key]:
                over_capacity.append((key, live))

    published = 0
    ticks = 0
    kills = list(zip(KILL_AT, KILLED, strict=True))
    frozen_until: float | None = None
    crashes: list[asyncio.Task[None]] = []
    done = False
    while not done:
        for _ in range(YIELDS):
            await asyncio.sleep(0)
        clock.advance(STEP)
        ticks += 1
        sim = ticks * STEP
        if published < N_TASKS:
            batch = tasks[published : published + PUBLISH_PER_TICK]
            await publisher.send_many(batch)
            published += len(batch)
        while kills and sim >= kills[0][0]:
            _, victim = kills.pop(0)
            crashes.append(asyncio.ensure_future(crash_consumer(consumers[victim])))
        if frozen_until is None and sim >= FREEZE_AT:
            drivers[FROZEN].freeze()
            frozen_until = FREEZE_AT + FREEZE_FOR
        elif frozen_until is not None and sim >= frozen_until and drivers[FROZEN].frozen:
            drivers[FROZEN].unfreeze()
        if ticks % 10 == 0:
            sample_live_leases()
            counts = await store.count_by_status()
            finished = counts.get("succeeded", 0) + counts.get("failed", 0)
            done = published == N_TASKS and not kills and finished == N_TASKS
            elapsed = time.monotonic() - started
            assert elapsed < REAL_TIME_LIMIT, f"soak too slow: {counts} after {sim:.0f}s simulated"
    await asyncio.gather(*crashes)
    loop_seconds = time.monotonic() - started

    # Quiet: stop the survivors (time keeps moving for their last pings and outcomes).
    alive = [c for w, c in consumers.items() if w not in KILLED]
    stopping = asyncio.ensure_future(asyncio.gather(*(c.stop() for c in alive)))
    while not stopping.done():
        await asyncio.sleep(0)
        clock.advance(STEP)
    await stopping

    # -- the verdict ------------------------------------------------------------------------------
    docs = {key: await store.get_task(key) for key in slots}
    lost = [
        k for k, doc in docs.items() if doc is None or doc["state"]["status"] not in ("succeeded", "failed")
    ]

    ran: dict[str, list[str]] = defaultdict(list)
    for key, _worker, attempt in completions:
        ran[key].append(attempt)
    unknown_outcome: set[str] = set()
    faulted_ping_attempts: set[str] = set()
    orphaned_attempts: set[str] = set()
    injected: Counter[tuple[str, str]] = Counter()
    for driver in drivers.values():
        injected += driver.injected
        for fault in driver.faults:
            if fault.op == "claim" and fault.kind == AFTER_APPLY:
                unknown_outcome.update(c.key for c in fault.result)
                orphaned_attempts.update(c.attempt for c in fault.result)
            elif fault.op == "finish" and fault.kind == AFTER_APPLY:
                unknown_outcome.update(p.key for p in fault.args[0])
            elif fault.op == "ping":
                groups = fault.args[0].groups.values()
                faulted_ping_attempts.update(a for group in groups for a in group.values())

    touched: set[str] = set(unknown_outcome)
    unexplained_lost: list[tuple[str, dict[str, Any]]] = []
    lost_leases: Counter[str] = Counter()  # by cause
    recorded_without_run: list[tuple[str, str]] = []
    over_recorded: list[str] = []
    drift: list[str] = []
    for key, doc in docs.items():
        if doc is None:
            continue
        entries = doc["state"]["worker_states"]
        if {f: doc["state"][f] for f in DERIVED_FIELDS} != expected_derived(doc):
            drift.append(key)
        successes = [e for e in entries if e["status"] == "succeeded"]
        if len(successes) > slots[key] or len({e["worker_id"] for e in successes}) != len(successes):
            over_recorded.append(key)
        recorded_without_run += [(key, e["attempt"]) for e in successes if e["attempt"] not in ran[key]]
        for e in entries:
            if e["status"] != "lost":
                continue
            touched.add(key)
            if e["worker_id"] in KILLED:
                lost_leases["killed"] += 1
            elif e["worker_id"] == FROZEN:
                lost_leases["frozen"] += 1
            elif e["attempt"] in orphaned_attempts:
                lost_leases["claim reply lost"] += 1
            elif e["attempt"] in faulted_ping_attempts:
                lost_leases["pings failed"] += 1
            else:
                unexplained_lost.append((key, e))
    duplicates = {key: len(runs) - slots[key] for key, runs in ran.items() if len(runs) > slots[key]}
    untouched_duplicates = {key: n for key, n in duplicates.items() if key not in touched}
    statuses = Counter(doc["state"]["status"] for doc in docs.values() if doc is not None)

    print(
        f"\nsoak: {N_CONSUMERS} consumers x {N_TASKS} tasks, {ticks} ticks = {ticks * STEP:.0f}s simulated, "
        f"{loop_seconds:.1f}s real ({time.monotonic() - started:.1f}s with shutdown)\n"
        f"soak: statuses={dict(statuses)} handler_successes={len(completions)}\n"
        f"soak: injected={dict(sorted((f'{op}/{kind}', n) for (op, kind), n in injected.items()))} "
        f"killed={list(KILLED)} frozen={FROZEN} for {FREEZE_FOR:.0f}s (lease {LEASE.total_seconds():.0f}s)\n"
        f"soak: lost_leases={sum(lost_leases.values())} {dict(lost_leases)} "
        f"unexplained_lost_leases={len(unexplained_lost)} "
        f"touched_tasks={len(touched)}\n"
        f"soak: lost={len(lost)} duplicate_successes={sum(duplicates.values())} "
        f"(untouched={sum(untouched_duplicates.values())}, in {len(duplicates)} touched tasks) "
        f"max_live_leases={max_live}"
    )
    assert published == N_TASKS
    assert not lost, f"{len(lost)} tasks lost, e.g. {[docs[k] for k in lost[:2]]}"
    assert not untouched_duplicates, f"duplicate successes without an injected cause: {untouched_duplicates}"
    assert not over_capacity and max_live <= 2, f"more live leases than slots: {over_capacity[:5]}"
    assert not unexplained_lost, (
        f"{len(unexplained_lost)} leases lost without a cause: {unexplained_lost[:2]}"
    )
    assert not over_recorded, f"tasks with more recorded successes than slots: {over_recorded[:5]}"
    assert not recorded_without_run, (
        f"successes recorded for runs that never completed: {recorded_without_run[:5]}"
    )
    assert not drift, f"derived state drifted on {drift[:5]}"
    # The faults really happened (a run that injected nothing would prove nothing).
    assert lost_leases["killed"] and lost_leases["frozen"] and lost_leases["claim reply lost"], lost_leases
    assert all(injected[(op, kind)] for op in ("claim", "finish", "ping") for kind in ("before", AFTER_APPLY))
