"""Benchmark 1: burn down no-op tasks with one Consumer on the MemoryDriver, in one process.

Tasks are published first (not timed); the figure is tasks/s from the first claim to the last
recorded success. Also reported: this process's peak RSS, throughput per tenth of the run (flat
when claims do not slow down as the store grows: run it with ``--tasks 100000``), and with
``--tracemalloc`` the peak of Python allocations (that run is slower; its rate is not the figure).

    python -m benchmarks.burn_down [--tasks 10000] [--concurrency 30] [--tracemalloc] [--events]
                                   [--limit N]

``--events`` runs it with the event log on (``MemoryDriver(events=True)``). ``--limit N`` sets a
flow limit ``max_running=N`` on the tasks' name first (``Operations.set_limit``): with N above the
concurrency it is never reached, and the run measures what the slots cost.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tracemalloc

from benchmarks.common import TASK_NAME, burn_down, emit, peak_rss_mib
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.operations import Operations


async def main(
    tasks: int,
    concurrency: int,
    trace: bool,
    events: bool = False,
    limit: int | None = None,
    reserve: bool = False,
) -> None:
    gc.collect()
    rss_before = peak_rss_mib()
    if trace:
        tracemalloc.start()
    driver = MemoryDriver(events=events)
    if limit is not None:
        await Operations(driver).set_limit(TASK_NAME, max_running=limit)
    run, consumer = await burn_down(driver, tasks=tasks, concurrency=concurrency, limit_reserve=reserve)
    result = {
        "benchmark": "burn_down",
        "events": events,
        "limit": limit,
        "reserve": reserve,
        "tasks": tasks,
        "concurrency": concurrency,
        "tasks_per_s": round(run.rate),
        "seconds": round(run.seconds, 3),
        "window_tasks_per_s": [round(r) for r in run.window_rates()],
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "rss_before_mib": round(rss_before, 1),
        "stats": consumer.stats,
        "limit_commands": consumer.limiter.commands,
    }
    if events:
        result["events_stored"] = len(driver._events)
        result["event_flushes"] = consumer.events.flushes if consumer.events is not None else 0
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result["tracemalloc_peak_mib"] = round(peak / 2**20, 1)
    emit(result)


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    parser.add_argument("--events", action="store_true", help="with the event log on")
    parser.add_argument("--limit", type=int, default=None, help="a flow limit max_running=N on the name")
    parser.add_argument("--reserve", action="store_true", help="Consumer(limit_reserve=True)")
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.concurrency, args.tracemalloc, args.events, args.limit, args.reserve))


if __name__ == "__main__":
    cli()
