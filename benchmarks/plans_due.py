"""Benchmark: N plans due at once (default 10,000): time to materialise them, and storage commands
per materialised occurrence beyond the task insert itself (target ≤ 0.05).

``memory``: driver calls counted by a thin wrapper. ``mongomock``: ``MongoDriver.commands``.
mongomock scans its collections on every command, so its TIMINGS ARE NOT FIGURES: only its
command count is. One planner, default batch (500): per batch one read of due plans, one
``insert_tasks``, one bulk compare-and-set (the previous-run read is not needed: no plan has run).

    python -m benchmarks.plans_due [--plans 10000] [--driver memory|mongomock]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.common import emit
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import Driver, InsertPlanParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.services.planner import Planner
from mscheduler.testing.clock import FakeClock

START = datetime(2030, 1, 1, tzinfo=UTC)


class CountingDriver:
    """Counts calls per operation, then delegates."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await target(*args, **kwargs)

        return call


async def main_async(plans: int, kind: str, batch: int) -> dict[str, Any]:
    clock = FakeClock(START)
    if kind == "memory":
        inner: Driver = MemoryDriver(clock=clock)
    else:
        from mscheduler.testing.mongomock import mongomock_database

        inner = MongoDriver(mongomock_database())
    await inner.setup()
    timing = PlanTiming(
        schedule=EverySchedule(interval=timedelta(hours=1), start=START + timedelta(minutes=1))
    )
    for i in range(plans):
        doc = Plan(plan_id=f"plan-{i}", name="noop", timing=timing).to_storage(clock.now())
        await inner.insert_plan(InsertPlanParams(doc, clock.now()))
    clock.advance(timedelta(minutes=1, seconds=5))
    counting = CountingDriver(inner)
    planner = Planner(counting, clock=clock, batch=batch)  # type: ignore[arg-type]
    before = inner.commands if isinstance(inner, MongoDriver) else 0
    started = time.perf_counter()
    made = await planner.run_once()
    elapsed = time.perf_counter() - started
    if made != plans:
        raise RuntimeError(f"materialised {made} occurrences, expected {plans}")
    calls = dict(counting.calls)
    if isinstance(inner, MongoDriver):
        commands = inner.commands - before
        insert_commands = calls.get("insert_tasks", 0)  # one insert_many each (no retries here)
    else:
        commands = sum(calls.values())
        insert_commands = calls.get("insert_tasks", 0)
    beyond = commands - insert_commands
    return {
        "benchmark": "plans_due",
        "driver": kind,
        "plans": plans,
        "batch": batch,
        "occurrences": made,
        "seconds": round(elapsed, 3),
        "occurrences_per_s": round(made / elapsed),
        "timing_is_a_figure": kind == "memory",
        "commands": commands,
        "calls_by_operation": calls,
        "commands_per_occurrence_beyond_insert": round(beyond / made, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plans", type=int, default=10_000)
    parser.add_argument("--driver", choices=("memory", "mongomock"), default="memory")
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    emit(asyncio.run(main_async(args.plans, args.driver, args.batch)))


if __name__ == "__main__":
    main()
