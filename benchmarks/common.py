"""Shared pieces: a simulated-latency driver, a burn-down runner, JSON output, machine facts."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import platform
import resource
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mscheduler.domain.model import Task
from mscheduler.drivers.base import ChangeEvent, Driver
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.publisher import Publisher

TASK_NAME = "noop"


class LatencyDriver:
    """Wraps a driver and waits ``delay`` seconds before delegating every request: a round trip.

    A thin delegator on purpose: ``mscheduler.testing.faults.FaultyDriver.set_latency`` does the same,
    but its fault bookkeeping costs enough per call to show in this benchmark. The change stream
    waits once when it opens; its events then pass straight through, as a server pushes them.
    """

    def __init__(self, inner: Driver, delay: float = 0.001) -> None:
        self.inner = inner
        self.delay = delay
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name == "watch":
            return self._watch
        if not inspect.iscoroutinefunction(target):
            return target

        async def request(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            await asyncio.sleep(self.delay)
            return await target(*args, **kwargs)

        setattr(self, name, request)  # built once per operation, not per call
        return request

    async def _watch(self, names: Sequence[str], resume_token: Any = None) -> AsyncIterator[ChangeEvent]:
        self.calls += 1
        await asyncio.sleep(self.delay)
        async for event in self.inner.watch(names, resume_token):
            yield event


def noop_tasks(count: int, start: int = 0) -> list[Task]:
    return [Task(f"task-{i}", TASK_NAME) for i in range(start, start + count)]


async def noop_handler() -> None:
    return None


@dataclass(slots=True)
class BurnDown:
    """Timestamps of one burn-down: the first claim, then every recorded outcome."""

    expected: int
    first_claim: float | None = None
    finished: list[float] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def listener(self, event: str, data: dict[str, Any]) -> None:
        if event == "claimed":
            if self.first_claim is None:
                self.first_claim = time.perf_counter()
        elif event == "finished":
            self.finished.append(time.perf_counter())
            outcome = data["outcome"]
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if len(self.finished) >= self.expected:
                self.done.set()

    @property
    def seconds(self) -> float:
        assert self.first_claim is not None and self.finished
        return self.finished[-1] - self.first_claim

    @property
    def rate(self) -> float:
        return len(self.finished) / self.seconds

    def window_rates(self, windows: int = 10) -> list[float]:
        """Tasks/s in consecutive equal slices of the finished tasks: flat if nothing degrades."""
        assert self.first_claim is not None
        size = len(self.finished) // windows
        rates = []
        start = self.first_claim
        for i in range(windows):
            end = self.finished[(i + 1) * size - 1]
            rates.append(size / (end - start))
            start = end
        return rates


async def burn_down(
    driver: Driver, *, tasks: int, concurrency: int, publish_batch: int = 1000, **consumer_options: Any
) -> tuple[BurnDown, Consumer]:
    """Publish ``tasks`` no-op tasks, then run one consumer until every one has succeeded."""
    publisher = Publisher(driver)
    for start in range(0, tasks, publish_batch):
        await publisher.send_many(noop_tasks(min(publish_batch, tasks - start), start))
    consumer = Consumer(driver, concurrency=concurrency, **consumer_options)
    consumer.register(TASK_NAME, noop_handler)
    run = BurnDown(expected=tasks)
    consumer.add_listener(run.listener)
    async with consumer:
        await asyncio.wait_for(run.done.wait(), timeout=600)
    if run.outcomes != {"succeeded": tasks}:
        raise RuntimeError(f"not every task succeeded: {run.outcomes}")
    return run, consumer


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def emit(result: dict[str, Any]) -> None:
    """One JSON line on stdout: what ``run_all`` collects."""
    print(json.dumps(result), flush=True)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
