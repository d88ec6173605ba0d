"""Benchmark 2: benchmark 1 with a simulated 1 ms round trip on every driver call.

``LatencyDriver`` sleeps ``--rtt-ms`` before delegating each call to a MemoryDriver, so the
consumer pays a round trip per claim, finish, ping and poll, as with a nearby MongoDB. Reported:
tasks/s from the first claim to the last success, and driver calls per task.

    python -m benchmarks.burn_down_latency [--tasks 10000] [--concurrency 30] [--rtt-ms 1] [--limit N]

``--limit N``: a flow limit ``max_running=N`` on the tasks' name (set before the run, without the
simulated round trip); with N above the concurrency it is never reached.
"""

from __future__ import annotations

import argparse
import asyncio

from benchmarks.common import TASK_NAME, LatencyDriver, burn_down, emit
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.operations import Operations


async def main(
    tasks: int, concurrency: int, rtt_ms: float, limit: int | None = None, reserve: bool = False
) -> None:
    memory = MemoryDriver()
    if limit is not None:
        await Operations(memory).set_limit(TASK_NAME, max_running=limit)
    driver = LatencyDriver(memory, delay=rtt_ms / 1000)
    run, consumer = await burn_down(driver, tasks=tasks, concurrency=concurrency, limit_reserve=reserve)
    emit(
        {
            "benchmark": "burn_down_latency",
            "tasks": tasks,
            "concurrency": concurrency,
            "rtt_ms": rtt_ms,
            "limit": limit,
            "reserve": reserve,
            "tasks_per_s": round(run.rate),
            "seconds": round(run.seconds, 3),
            "driver_calls": driver.calls,
            "stats": consumer.stats,
        }
    )


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--rtt-ms", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=None, help="a flow limit max_running=N on the name")
    parser.add_argument("--reserve", action="store_true", help="Consumer(limit_reserve=True)")
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.concurrency, args.rtt_ms, args.limit, args.reserve))


if __name__ == "__main__":
    cli()
