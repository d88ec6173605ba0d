"""Benchmark: ``task_stats`` over N finished tasks (default 100,000) plus a pending backlog.

The finished tasks end over the last two hours (about half inside the default one-hour window):
90 % succeed on their first attempt, 10 % fail for good. Reported: the time of a full
``Operations.stats(window=1 h)`` and of the metrics' gauge read (``window=None``, pending and
running only), best of ``--repeat`` runs.

``memory`` is the figure (one pass over every task in Python). ``mongomock`` only checks that
the pipelines give the same numbers at this size: mongomock evaluates pipelines in Python over
every document, so its TIMINGS ARE NOT FIGURES (on a server the plan reads the window's tasks
through ``stats_finished`` and the counts from ``stats_counts``'s keys; docs/design.md).
Filling mongomock is slow too (about 14 minutes for 5,000 tasks on a 2-core machine).

    python -m benchmarks.stats_bench [--finished 100000] [--pending 1000] [--driver memory|mongomock]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.common import emit, machine
from mscheduler.domain.model import TaskOption
from mscheduler.drivers.base import ClaimParams, Driver, FinishParams, InsertParams, NewTask
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.operations import Operations
from mscheduler.testing.clock import FakeClock

START = datetime(2030, 1, 1, tzinfo=UTC)
BATCH = 1000
NAMES = ("bench.a", "bench.b", "bench.c", "bench.d")


async def fill(driver: Driver, clock: FakeClock, finished: int, pending: int) -> None:
    """``finished`` tasks claimed and ended in batches spread over two hours, then a backlog."""
    batches = max(1, finished // BATCH)
    step = timedelta(hours=2) / batches
    done = 0
    for b in range(batches):
        size = min(BATCH, finished - done) if b < batches - 1 else finished - done
        name = NAMES[b % len(NAMES)]
        option = TaskOption(max_unexpected_retries=0).to_storage(clock.now())
        tasks = [NewTask(f"f-{done + i}", name, {"i": done + i}, option) for i in range(size)]
        await driver.insert_tasks(InsertParams(tasks, clock.now()))
        attempts = [f"a-{done + i}" for i in range(size)]
        claimed = await driver.claim(ClaimParams("bench", [name], clock.now(), attempts))
        clock.advance(1 + b % 5)  # the attempts run 1 to 5 s
        outcomes = [
            FinishParams(
                c.key,
                "bench",
                c.attempt,
                clock.now(),
                "failed" if int(c.key[2:]) % 10 == 0 else "succeeded",
                error={"type": "E", "message": "boom", "traceback": None}
                if int(c.key[2:]) % 10 == 0
                else None,
            )
            for c in claimed
        ]
        await driver.finish(outcomes)
        clock.advance(step.total_seconds() - (1 + b % 5))
        done += size
    option = TaskOption().to_storage(clock.now())
    for start in range(0, pending, BATCH):
        tasks = [
            NewTask(f"p-{i}", NAMES[i % len(NAMES)], {}, option)
            for i in range(start, min(pending, start + BATCH))
        ]
        await driver.insert_tasks(InsertParams(tasks, clock.now()))
    clock.advance(30)


async def best_of(repeat: int, call: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = await call()
        best = min(best, time.perf_counter() - started)
    return best, result


async def main_async(finished: int, pending: int, kind: str, repeat: int) -> dict[str, Any]:
    clock = FakeClock(START)
    if kind == "memory":
        driver: Driver = MemoryDriver(clock=clock)
    else:
        from mscheduler.testing.mongomock import mongomock_database

        driver = MongoDriver(mongomock_database())
    await driver.setup()
    started = time.perf_counter()
    await fill(driver, clock, finished, pending)
    fill_seconds = time.perf_counter() - started
    ops = Operations(driver, clock=clock)
    full_seconds, full = await best_of(repeat, lambda: ops.stats(window=timedelta(hours=1)))
    gauge_seconds, gauge = await best_of(
        repeat, lambda: ops.stats(window=None, statuses=("pending", "running"))
    )
    return {
        "benchmark": "stats",
        "driver": kind,
        "finished_tasks": finished,
        "pending_tasks": pending,
        "fill_seconds": round(fill_seconds, 2),
        "stats_window_1h_ms": round(full_seconds * 1000, 1),
        "stats_gauges_ms": round(gauge_seconds * 1000, 1),
        "finished_in_window": full.finished,
        "first_attempt_success_rate": round(full.first_attempt_success_rate or 0, 4),
        "throughput_last_hour": sum(b.succeeded + b.failed for b in full.throughput),
        "pending_counted": gauge.counts["pending"],
        "timings_are_figures": kind == "memory",
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument("--driver", choices=("memory", "mongomock"), default="memory")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    emit(asyncio.run(main_async(args.finished, args.pending, args.driver, args.repeat)))


if __name__ == "__main__":
    main()
