"""Benchmark 4: publish → handler start latency, one process, an idle consumer, MemoryDriver.

Each of ``--sends`` sequential sends is timed from just before ``publisher.send`` to the first line
of its handler; the next send waits until the previous task's outcome is recorded, so the
consumer is idle each time. Reported: p50 / p90 / p99 / max in milliseconds, and the claim
attempts per send (each one a storage command on MongoDB; 1.0 means no claim came back empty).

    python -m benchmarks.publish_latency [--sends 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks.common import emit
from mscheduler.domain.model import Task
from mscheduler.drivers.base import ClaimedTask, ClaimParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.publisher import Publisher


class CountingMemoryDriver(MemoryDriver):
    """Counts claim attempts (one command each on MongoDB) and the ones that found nothing."""

    attempts = 0
    empty = 0

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        claimed = await super().claim(params)
        self.attempts += len(params.attempts)
        self.empty += len(params.attempts) - len(claimed)
        return claimed


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


async def main(sends: int, warmup: int) -> None:
    driver = CountingMemoryDriver()
    publisher = Publisher(driver)
    consumer = Consumer(driver, concurrency=10)
    started = asyncio.Event()
    finished = asyncio.Event()
    start_time = 0.0

    async def handler() -> None:
        nonlocal start_time
        start_time = time.perf_counter()
        started.set()

    def listener(event: str, data: dict[str, Any]) -> None:
        if event == "finished":
            finished.set()

    consumer.register("latency", handler)
    consumer.add_listener(listener)
    latencies: list[float] = []
    async with consumer:
        for i in range(warmup + sends):
            if i == warmup:
                driver.attempts = driver.empty = 0
            started.clear()
            finished.clear()
            sent = time.perf_counter()
            await publisher.send(Task(f"latency-{i}", "latency"))
            await asyncio.wait_for(started.wait(), timeout=10)
            if i >= warmup:
                latencies.append(start_time - sent)
            await asyncio.wait_for(finished.wait(), timeout=10)
    latencies.sort()
    emit(
        {
            "benchmark": "publish_latency",
            "sends": sends,
            "p50_ms": round(percentile(latencies, 50) * 1000, 3),
            "p90_ms": round(percentile(latencies, 90) * 1000, 3),
            "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "max_ms": round(latencies[-1] * 1000, 3),
            "claim_attempts_per_send": round(driver.attempts / sends, 3),
            "empty_claim_attempts_per_send": round(driver.empty / sends, 3),
            "stats": consumer.stats,
        }
    )


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=20, help="sends before measuring (not counted)")
    args = parser.parse_args()
    asyncio.run(main(args.sends, args.warmup))


if __name__ == "__main__":
    cli()
