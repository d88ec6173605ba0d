"""Fairness and aging on a fake clock: who waits behind whom.

Consumers run on one ``MemoryDriver`` and one ``FakeClock``; each handler takes ``duration`` fake
seconds; time moves in steps of ``step`` seconds, the event loop running the consumers between.

* ``fairness``: key A sends ``backlog`` tasks, then keys B, C, ... send ``small_tasks`` each (all
  due at once); ``consumers`` consumers of ``concurrency`` handlers. Measured: the fake time at
  which each small key's last task finished, and the claims made by then. With fair keys the
  claims rotate across keys; without (the same tasks, no ``fair_key``) they go in due order, so
  the small keys wait for A's backlog. The stated bound (docs/features.md): a key's n-th task is
  claimed within ``n x K`` claims of the fleet, K the keys with due tasks, plus one claim batch
  per consumer (each consumer rotates on its own).
* ``aging``: a flood of priority-10 tasks, ``flood_rate`` per fake second (more than the fleet
  runs), and one priority-0 task sent at ``low_at``. Measured: when the low task started, and
  the latest send time of a flood task claimed before it. With ``aging`` it starts before any
  flood task sent later than ``low_at + 10 x aging``; without, it waits for the flood to end.

    python -m benchmarks.flow_sim [--backlog 100000] [--aging-seconds 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import string
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.model import Task, TaskOption
from mscheduler.drivers.base import ChangeStreamUnsupported
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.consumer.runner import TaskContext
from mscheduler.runtime.publisher import Publisher
from mscheduler.testing.clock import FakeClock

OPTION = TaskOption(ping_interval=timedelta(seconds=5), worker_timeout=timedelta(seconds=30))


class PollingMemoryDriver(MemoryDriver):
    """A memory store without change events: consumers learn of work by polling alone (as on a
    standalone server), lanes included."""

    def watch(self, names: Any, resume_token: Any = None) -> Any:
        async def unsupported() -> Any:
            raise ChangeStreamUnsupported("this store polls")
            yield  # an async generator

        return unsupported()


async def _settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@dataclass
class FairnessRun:
    fair: bool
    backlog: int
    small_keys: int
    small_tasks: int
    consumers: int
    concurrency: int
    duration: float
    finished_at: dict[str, float] = field(default_factory=dict)  # small key -> last task done (fake s)
    claims_by_then: int = 0  # claims the fleet made until the last small key finished
    backlog_done_by_then: int = 0  # A's tasks finished by then
    wall_seconds: float = 0.0

    @property
    def keys(self) -> int:
        return self.small_keys + 1

    @property
    def claim_bound(self) -> int:
        """The stated bound: the n-th task of a key within n x K claims, plus a batch per consumer."""
        return self.small_tasks * self.keys + self.consumers * self.concurrency

    def as_dict(self) -> dict[str, Any]:
        return {
            "fair": self.fair,
            "backlog": self.backlog,
            "small_keys": self.small_keys,
            "small_tasks": self.small_tasks,
            "consumers": self.consumers,
            "concurrency": self.concurrency,
            "last_small_key_done_s": max(self.finished_at.values(), default=None),
            "claims_by_then": self.claims_by_then,
            "claim_bound": self.claim_bound,
            "backlog_done_by_then": self.backlog_done_by_then,
            "wall_seconds": round(self.wall_seconds, 2),
        }


def _small_keys(n: int) -> list[str]:
    return list(string.ascii_uppercase[1 : 1 + n])


async def fairness(
    *,
    backlog: int = 2000,
    small_keys: int = 9,
    small_tasks: int = 10,
    consumers: int = 4,
    concurrency: int = 4,
    duration: float = 1.0,
    fair: bool = True,
    step: float = 0.25,
    limit: float = 100_000.0,
    streams: bool = True,
) -> FairnessRun:
    """Key A's backlog and the small keys' tasks (module docstring); runs until every small key's
    tasks have finished (or ``limit`` fake seconds)."""
    clock = FakeClock()
    store = MemoryDriver(clock=clock) if streams else PollingMemoryDriver(clock=clock)
    publisher = Publisher(store, clock=clock)
    run = FairnessRun(fair, backlog, small_keys, small_tasks, consumers, concurrency, duration)
    keys = _small_keys(small_keys)
    left = dict.fromkeys(keys, small_tasks)
    claims = 0
    backlog_done = 0
    start = clock.now()

    def option(key: str) -> TaskOption:
        return OPTION.model_copy(update={"fair_key": key}) if fair else OPTION

    async def work(params: dict[str, Any], ctx: TaskContext) -> None:
        nonlocal backlog_done
        await clock.sleep(duration)
        key = params["k"]
        if key == "A":
            backlog_done += 1
            return
        left[key] -= 1
        if left[key] == 0:
            run.finished_at[key] = (clock.now() - start).total_seconds()

    def count(event: str, data: dict[str, Any]) -> None:
        nonlocal claims
        if event == "claimed":
            claims += 1
            if len(run.finished_at) < len(keys):
                run.claims_by_then = claims

    a_option = option("A")
    await publisher.send_many(Task(f"A-{i}", "work", {"k": "A"}, option=a_option) for i in range(backlog))
    for key in keys:
        key_option = option(key)
        await publisher.send_many(
            Task(f"{key}-{i}", "work", {"k": key}, option=key_option) for i in range(small_tasks)
        )
    fleet = [
        Consumer(
            store, worker_id=f"c{i}", clock=clock, concurrency=concurrency, planner=False, poll_interval=1.0
        )
        for i in range(consumers)
    ]
    for consumer in fleet:
        consumer.register("work", work)
        consumer.add_listener(count)
    began = time.perf_counter()
    for consumer in fleet:
        await consumer.start()
    elapsed = 0.0
    while len(run.finished_at) < len(keys) and elapsed < limit:
        clock.advance(step)
        elapsed += step
        await _settle()
    run.backlog_done_by_then = backlog_done
    run.wall_seconds = time.perf_counter() - began
    for consumer in fleet:
        await consumer.stop(grace=0)
    return run


@dataclass
class AgingRun:
    aging: float | None  # seconds per priority level (None: no aging)
    flood_rate: int
    low_at: float
    low_started: float | None = None  # fake seconds
    latest_flood_send_before_low: float | None = None  # send time of the latest flood task claimed before
    flood_claimed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "aging_s": self.aging,
            "flood_rate": self.flood_rate,
            "low_sent_s": self.low_at,
            "low_started_s": self.low_started,
            "latest_flood_send_claimed_before_low_s": self.latest_flood_send_before_low,
            "flood_claimed": self.flood_claimed,
        }


async def aging(
    *,
    aging_seconds: float | None = 1.0,
    flood_rate: int = 24,
    low_at: float = 5.0,
    run_for: float = 60.0,
    consumers: int = 4,
    concurrency: int = 4,
    duration: float = 1.0,
    step: float = 0.25,
) -> AgingRun:
    """A flood of priority-10 tasks and one priority-0 task (module docstring), for ``run_for``
    fake seconds or until the low task started."""
    clock = FakeClock()
    store = MemoryDriver(clock=clock)
    publisher = Publisher(store, clock=clock)
    run = AgingRun(aging_seconds, flood_rate, low_at)
    step_aging = timedelta(seconds=aging_seconds) if aging_seconds is not None else None
    start = clock.now()
    sent_at: dict[str, float] = {}

    def since(when: datetime) -> float:
        return (when - start).total_seconds()

    async def work(params: Any, ctx: TaskContext) -> None:
        await clock.sleep(duration)

    def seen(event: str, data: dict[str, Any]) -> None:
        if event != "claimed" or run.low_started is not None:
            return
        if data["key"] == "low":
            run.low_started = since(clock.now())
            return
        run.flood_claimed += 1
        sent = sent_at[data["key"]]
        if run.latest_flood_send_before_low is None or sent > run.latest_flood_send_before_low:
            run.latest_flood_send_before_low = sent

    fleet = [
        Consumer(
            store, worker_id=f"c{i}", clock=clock, concurrency=concurrency, planner=False, poll_interval=1.0
        )
        for i in range(consumers)
    ]
    for consumer in fleet:
        consumer.register("work", work)
        consumer.add_listener(seen)
        await consumer.start()
    high = OPTION.model_copy(update={"priority": 10, "aging": step_aging})
    low = OPTION.model_copy(update={"priority": 0, "aging": step_aging})
    elapsed, second, n = 0.0, -1, 0
    while elapsed < run_for and run.low_started is None:
        if int(elapsed) > second:  # a second's share of the flood, sent at its start
            second = int(elapsed)
            batch = [Task(f"f{n + i}", "work", option=high) for i in range(flood_rate)]
            n += flood_rate
            now = since(clock.now())
            sent_at.update((t.key, now) for t in batch)
            await publisher.send_many(batch)
        if run.low_started is None and "low" not in sent_at and elapsed >= low_at:
            sent_at["low"] = since(clock.now())
            await publisher.send(Task("low", "work", option=low))
        clock.advance(step)
        elapsed += step
        await _settle()
    for consumer in fleet:
        await consumer.stop(grace=0)
    return run


async def main(backlog: int, aging_seconds: float) -> dict[str, Any]:
    fair = await fairness(backlog=backlog)
    plain_backlog = min(backlog, 20_000)  # without fairness the small keys wait for all of A
    plain = await fairness(backlog=plain_backlog, fair=False)
    aged = await aging(aging_seconds=aging_seconds)
    unaged = await aging(aging_seconds=None)
    return {
        "fairness": fair.as_dict(),
        "without_fairness": plain.as_dict(),
        "aging": aged.as_dict(),
        "without_aging": unaged.as_dict(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--aging-seconds", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args.backlog, args.aging_seconds))
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, values in figures.items():
            print(name, values)
