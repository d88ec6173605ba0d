"""Per-step cost of workflows against a plain task and today's child tasks, on the MemoryDriver,
one Consumer (concurrency 30), in one process, real clock.

Shapes, each ``--steps`` steps in all (a no-op handler each; the ``Task`` objects are built
before the clock starts, their sending is timed: a map step's items are made while it runs):

* ``plain``: that many tasks of no family;
* ``children``: families of 5 parallel children (today's child tasks);
* ``sequence``: families of 5 sequential children (today's: each after the one before);
* ``chain``: workflows of 5 steps, each needing the one before (a results read per step);
* ``map``: one workflow: a list step returning ``steps - 2`` items, a map step over it, a join.

The figures are microseconds per step from the send to the last step's success (the
parents' follow-up included: a family is done only when its parent is), as this process's CPU
time (the cost: the store is in process, and CPU time is what other load on a shared machine
disturbs least) and as wall time, each with its ratio to ``plain`` (medians over ``--rounds``;
the shapes alternate round by round, so a noisy machine's drift hits each alike). Then one more
run of each shape counts the consumer's storage calls per step (a ``FaultyDriver`` that injects
nothing): with MongoDB each is a round trip (a sync is a few: its reads and writes), so they are
what a step costs there.

``--mongo-steps N``: one more run of each shape with N steps on the MongoDriver over mongomock,
counting the commands it sends per step (mongomock scans: counted, not timed).

    python -m benchmarks.workflow_steps [--steps 10000] [--rounds 3] [--mongo-steps 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from typing import Any

from benchmarks.commands_per_task import FAKE_ONLY, ONE_OFF, TIME_DRIVEN, CountingMongoDriver
from benchmarks.common import emit
from mscheduler import Child, Consumer, MemoryDriver, Publisher, Task, TaskContext, TaskStatus
from mscheduler.testing.faults import FaultyDriver
from mscheduler.testing.mongomock import mongomock_database

SUCCEEDED = TaskStatus.SUCCEEDED.value

SHAPES = ("plain", "children", "sequence", "chain", "map")
FAMILY = 5


async def noop(params: Any, ctx: TaskContext) -> Any:
    return None


async def listing(params: Any, ctx: TaskContext) -> list[int]:
    return list(range(params["n"]))


def tasks_of(shape: str, steps: int) -> tuple[list[Task], list[str]]:
    """The tasks to send and the keys whose end means the run is over."""
    if shape == "plain":
        tasks = [Task(f"t{i}", "step") for i in range(steps)]
        return tasks, [tasks[-1].key]
    if shape in ("children", "sequence"):
        names = [f"step{j}" for j in range(FAMILY)]
        mode = "parallel" if shape == "children" else "sequential"
        tasks = [Task(f"f{i}", "f", children=names, children_mode=mode) for i in range(steps // FAMILY)]
        return tasks, [t.key for t in tasks]
    if shape == "chain":
        chain = [Child("step0"), *(Child(f"step{j}", needs=[f"step{j - 1}"]) for j in range(1, FAMILY))]
        tasks = [Task(f"w{i}", "w", children=chain) for i in range(steps // FAMILY)]
        return tasks, [t.key for t in tasks]
    children = [
        Child("list"),
        Child("step", map_over="list", max_items=100_000),
        Child("join", needs=["step"]),
    ]
    return [Task("m", "m", {"n": steps - 2}, children=children)], ["m"]


async def run(shape: str, steps: int, calls: Counter[str] | None = None) -> tuple[float, float]:
    driver = MemoryDriver()
    # counting: the consumer's storage calls through a FaultyDriver that injects nothing
    counted = FaultyDriver(driver) if calls is not None else None
    consumer = Consumer(counted or driver, concurrency=30, poll_interval=1.0)
    for name in ["step", "join", *(f"step{j}" for j in range(FAMILY))]:
        consumer.register(name, noop)
    consumer.register("list", listing)
    publisher = Publisher(driver)
    tasks, ends = tasks_of(shape, steps)
    started, cpu = time.perf_counter(), time.process_time()
    await publisher.send_many(tasks)
    await consumer.start()
    try:
        for key in ends:  # the stored document's status (no model built: the check costs little)
            while True:
                doc = await driver.get_task(key)
                if doc is not None and doc["state"]["status"] == SUCCEEDED:
                    break
                await asyncio.sleep(0.01)
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await consumer.stop()
        if counted is not None and calls is not None:
            calls.update(counted.calls)


async def mongo_commands(shape: str, steps: int) -> dict[str, float]:
    """Commands per step the MongoDriver sends for ``shape`` (on mongomock: counted, not timed),
    sending included; time-driven, one-off and fake-only commands left out (as in
    ``benchmarks.commands_per_task``)."""
    driver = CountingMongoDriver(mongomock_database(f"wf_{shape}"))
    await driver.setup()
    consumer = Consumer(driver, concurrency=30, poll_interval=1.0)
    for name in ["step", "join", *(f"step{j}" for j in range(FAMILY))]:
        consumer.register(name, noop)
    consumer.register("list", listing)
    tasks, ends = tasks_of(shape, steps)
    driver.by_operation.clear()
    await Publisher(driver).send_many(tasks)
    await consumer.start()
    try:
        for key in ends:
            while True:
                doc = await driver.get_task(key)
                if doc is not None and doc["state"]["status"] == SUCCEEDED:
                    break
                await asyncio.sleep(0.01)
    finally:
        await consumer.stop()
    left_out = TIME_DRIVEN | ONE_OFF | FAKE_ONLY | {"get task"}  # the end check's reads
    counted = {op: n for op, n in driver.by_operation.items() if op not in left_out}
    out = {op: round(n / steps, 2) for op, n in sorted(counted.items()) if n >= steps / 100}
    out["total"] = round(sum(counted.values()) / steps, 2)
    return out


async def main(steps: int, rounds: int, mongo_steps: int = 0) -> None:
    seconds: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    cpu: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for _ in range(rounds):
        for shape in SHAPES:
            wall, used = await run(shape, steps)
            seconds[shape].append(wall)
            cpu[shape].append(used)

    def per_step(of: dict[str, list[float]]) -> dict[str, float]:
        return {s: statistics.median(v) / steps * 1e6 for s, v in of.items()}

    wall_us, cpu_us = per_step(seconds), per_step(cpu)
    calls: dict[str, Counter[str]] = {shape: Counter() for shape in SHAPES}
    for shape in SHAPES:  # one more run each, counting the consumer's storage calls (not timed)
        await run(shape, steps, calls[shape])
    mongo = {shape: await mongo_commands(shape, mongo_steps) for shape in SHAPES} if mongo_steps else {}
    skipped = {"register_worker", "heartbeat_worker", "unregister_worker", "prepare", "server_time"}
    skipped |= {"watch", "watch_event"}  # the change stream, not calls
    emit(
        {
            "benchmark": "workflow_steps",
            "steps": steps,
            "rounds": rounds,
            "cpu_us_per_step": {s: round(v, 1) for s, v in cpu_us.items()},
            "cpu_ratio_to_plain": {s: round(v / cpu_us["plain"], 2) for s, v in cpu_us.items()},
            "wall_us_per_step": {s: round(v, 1) for s, v in wall_us.items()},
            "wall_ratio_to_plain": {s: round(v / wall_us["plain"], 2) for s, v in wall_us.items()},
            "wall_seconds": {s: [round(x, 3) for x in v] for s, v in seconds.items()},
            "store_calls_per_step": {
                shape: {
                    op: round(n / steps, 2)
                    for op, n in sorted(c.items())
                    if op not in skipped and n >= steps / 100
                }
                for shape, c in calls.items()
            },
            "mongo_commands_per_step": mongo,
            # the figures run_all compares with the 1.5x target
            "map_cpu_ratio": round(cpu_us["map"] / cpu_us["plain"], 2),
            "chain_cpu_ratio": round(cpu_us["chain"] / cpu_us["plain"], 2),
        }
    )


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--mongo-steps", type=int, default=0, help="also count MongoDriver commands (mongomock)"
    )
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.rounds, args.mongo_steps))


if __name__ == "__main__":
    cli()
