"""Benchmark 3: storage commands per task with the MongoDriver (counted on mongomock).

``MongoDriver.commands`` counts the commands actually sent (a retried command counts again);
this benchmark also breaks them down by operation. mongomock is used for COUNTING only: it scans
the whole collection on every operation, so its timings say nothing and are not reported.

Two steady states, both with the default ``Consumer`` settings and ``send_many`` calls of 100:

* ``backlog``: a publisher sends batches of 100 while one consumer (concurrency 30) works them
  off; the consumer always has work waiting.
* ``trickle``: each batch of 100 is sent only when the previous one has finished, so the
  consumer runs out of work 1 time in 100 tasks (the worst case for over-asking claims).

Start-up and a first warm-up batch of 100 are not counted. Commands are split into per-task ones
(insert, claim, finish and their read-backs), time-driven ones (polls, pings, heartbeats, clock
syncs), whose number grows with run time, not with tasks — mongomock makes runs far longer than a
real server would, so their share here overstates the real one (see README) — and one-off ones
(the store's set-up, the publisher's index check on its first send), reported apart.

    python -m benchmarks.commands_per_task [--tasks 1000] [--mode backlog|trickle] [--events] [--limit N]
                                           [--no-reserve]

``--limit N``: with a flow limit ``max_running=N`` on the tasks' name (acquire, settle and release
writes count per task; the slot extensions before pings are time-driven, and so are the releases
sent because their hold ran out - ``Limiter.flush``, at most one per limit and worker per
``RELEASE_HOLD`` - reported as ``held_releases``). ``--no-reserve``: ``Consumer(limit_reserve=False)``.

``--events``: with the event log on (``MongoDriver(events=True)``); the event inserts count as
per-task commands, the expiry passes' reads for events as time-driven ones.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from typing import Any

from benchmarks.common import TASK_NAME, emit, noop_handler, noop_tasks
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.operations import Operations
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.publisher import Publisher
from mscheduler.testing.mongomock import mongomock_database

SEND_BATCH = 100
TIME_DRIVEN = frozenset(
    {
        "expire leases",
        "expire leases of earlier generations",  # the lease pass's second range (issue 17)
        "expire deadlines",
        "expire leases (read)",  # mongomock only: its lease pass reads, then updates one by one
        "find wake-ups",
        "ping",
        "ping read",
        "worker heartbeat",
        "hello",
        "server time",
        "find due plans",  # the consumer's planner, once per planner_interval
        "find open parents",  # the child tasks' reconciler pass, every 10 s
        "expire leases (read for events)",  # with --events: the lease pass reads first
        "expire deadlines (read for events)",
        "read limit keys",  # every Consumer(limits_interval), limits or not
        "extend slots",  # with --limit: the slots renewed before each ping round
    }
)
ONE_OFF = frozenset(
    {
        "create indexes",
        "create plan indexes",
        "create limit indexes",
        "put limit",
        "put limit (who holds the names)",
        "create event indexes",
        "register worker",
        "unregister worker",
    }
)


class CountingMongoDriver(MongoDriver):
    """A MongoDriver that also counts its commands by operation (``_call``'s ``what``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.by_operation: Counter[str] = Counter()

    async def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        self.by_operation[what] += 1
        return await super()._call(what, *args, **kwargs)


async def main(
    tasks: int,
    mode: str,
    concurrency: int,
    events: bool = False,
    limit: int | None = None,
    reserve: bool = True,
) -> None:
    driver = CountingMongoDriver(mongomock_database(), events=events)
    await driver.setup()
    if limit is not None:
        await Operations(driver).set_limit(TASK_NAME, max_running=limit)
    publisher = Publisher(driver)
    consumer = Consumer(driver, concurrency=concurrency, limit_reserve=reserve)
    consumer.register(TASK_NAME, noop_handler)
    finished = 0
    progress = asyncio.Event()

    def listener(event: str, data: dict[str, Any]) -> None:
        nonlocal finished
        if event == "finished":
            finished += 1
            progress.set()

    async def wait_finished(count: int) -> None:
        while finished < count:
            progress.clear()
            await progress.wait()

    consumer.add_listener(listener)
    async with consumer:
        # Steady state only: start-up and a first warm-up batch of 100 are not counted.
        await publisher.send_many(noop_tasks(SEND_BATCH, tasks))
        await asyncio.wait_for(wait_finished(SEND_BATCH), timeout=600)
        commands_before = driver.commands
        counted_before = Counter(driver.by_operation)
        held_before = consumer.limiter.commands.get("release_held", 0)
        for start in range(0, tasks, SEND_BATCH):
            await publisher.send_many(noop_tasks(min(SEND_BATCH, tasks - start), start))
            if mode == "trickle":
                await wait_finished(SEND_BATCH + start + SEND_BATCH)
            else:
                await asyncio.sleep(0)
        await asyncio.wait_for(wait_finished(SEND_BATCH + tasks), timeout=1800)
        commands = driver.commands - commands_before
        by_operation = driver.by_operation - counted_before
        held = consumer.limiter.commands.get("release_held", 0) - held_before
    if consumer.stats["succeeded"] != SEND_BATCH + tasks:
        raise RuntimeError(f"not every task succeeded: {consumer.stats}")
    if sum(by_operation.values()) != commands:
        raise RuntimeError(f"breakdown {sum(by_operation.values())} != MongoDriver.commands {commands}")
    # a release whose hold ran out (Limiter.flush, RELEASE_HOLD) is time-driven: at most one per
    # limit and worker per hold, however many tasks; the others ride on the acquires
    per_task = sum(n for op, n in by_operation.items() if op not in TIME_DRIVEN | ONE_OFF) - held
    time_driven = sum(n for op, n in by_operation.items() if op in TIME_DRIVEN) + held
    emit(
        {
            "benchmark": "commands_per_task",
            "mode": mode,
            "events": events,
            "limit": limit,
            "reserve": reserve,
            "tasks": tasks,
            "concurrency": concurrency,
            "send_batch": SEND_BATCH,
            "commands": commands,
            "commands_per_task": round(commands / tasks, 3),
            "per_task_commands_per_task": round(per_task / tasks, 3),
            "time_driven_commands": time_driven,
            "held_releases": held,
            "one_off_commands": commands - per_task - time_driven,
            "by_operation": dict(by_operation.most_common()),
        }
    )


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=1000, help="keep it small: mongomock is O(n) per op")
    parser.add_argument("--mode", choices=["backlog", "trickle"], default="backlog")
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--events", action="store_true", help="with the event log on")
    parser.add_argument("--limit", type=int, default=None, help="a flow limit max_running=N on the name")
    parser.add_argument(
        "--no-reserve", action="store_true", help="Consumer(limit_reserve=False): one acquire per claim"
    )
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.mode, args.concurrency, args.events, args.limit, not args.no_reserve))


if __name__ == "__main__":
    cli()
