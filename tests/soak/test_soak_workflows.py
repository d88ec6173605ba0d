"""The workflow soak: 20 consumers, each on its own ``FaultyDriver`` over one ``MemoryDriver``,
run 300 random workflows (the shapes of the model-based test: list steps, map steps over them of
up to 12 items, joins, steps needing several others) while their storage calls fail at random —
claims, pings, finishes, the parents' syncs, the reads of a step's inputs, the fan-outs' inserts
and records, before or after they were applied — and three consumers are killed mid-run.

Checked every simulated second: no task holds two live leases (running, unexpired entries) and
no handler runs a task that another handler is running. Checked at the end: every workflow
succeeded with the model's result (nothing lost), every map step has exactly one item per element
(no fan-out twice), and no attempt is left running. The figures are printed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Consumer, FakeClock, MemoryDriver, Publisher, TaskContext, TaskStatus
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from tests.helpers import as_driver
from tests.scenarios.test_workflow_model import (
    Step,
    item_result,
    model,
    random_dag,
    step_result,
    workflow,
)

N_CONSUMERS = 20
N_WORKFLOWS = 300
SEED = 20261128
STEP = 0.25  # simulated seconds per tick
YIELDS = 6
KILLED = {"c03": 8.0, "c11": 16.0, "c17": 24.0}  # worker -> simulated second it dies
FAULT_RATES = {
    ("claim", False): 0.01,
    ("claim", True): 0.005,
    ("finish", False): 0.01,
    ("finish", True): 0.005,
    ("ping", False): 0.02,
    ("sync_parents", False): 0.02,
    ("sync_parents", True): 0.01,
    ("read_results", False): 0.02,
    ("insert_tasks", True): 0.05,
    ("expand_map", False): 0.05,
}
REAL_TIME_LIMIT = 240.0
SIMULATED_LIMIT = 600.0


@pytest.mark.soak
@pytest.mark.timeout(300)
async def test_soak_300_workflows_on_20_consumers_with_faults() -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    clock = FakeClock()
    store = MemoryDriver(clock=clock)
    publisher = Publisher(store, clock=clock)
    shapes = {f"wf{n:03d}": random_dag(rng) for n in range(N_WORKFLOWS)}
    for steps in shapes.values():
        for step in steps:
            if step.kind == "list":
                step.length = rng.randint(0, 12)
    running: set[str] = set()
    twice: list[str] = []
    runs: Counter[str] = Counter()

    def handler_of(kind: str) -> Any:
        async def handler(params: Any, ctx: TaskContext) -> Any:
            if ctx.key in running:
                twice.append(ctx.key)
            running.add(ctx.key)
            runs[ctx.key] += 1
            try:
                await clock.sleep(rng.uniform(0.1, 3.0))
                if kind == "map":
                    return item_result(params)
                workflow_key, _, name = ctx.key.partition("/")
                return step_result(steps_by_workflow[workflow_key][name], ctx.results)
            finally:
                running.discard(ctx.key)

        return handler

    steps_by_workflow: dict[str, dict[str, Step]] = {
        key: {s.name: s for s in steps} for key, steps in shapes.items()
    }
    kinds = {s.name: s.kind for steps in shapes.values() for s in steps}
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
            concurrency=8,
            clock=clock,
            poll_interval=1.0,
            children_interval=5.0,
        )
        # one handler per step name; a name is a list / value step in one workflow and may be a
        # map step in another: the handler decides by the task (an item's parent is a map step)
        for name in sorted(kinds):
            consumer.register(name, _by_task(handler_of("map"), handler_of("value")))
        drivers[worker_id], consumers[worker_id] = driver, consumer
    for consumer in consumers.values():
        await consumer.start()

    for key, steps in shapes.items():
        await publisher.send(workflow(key, steps))

    max_live = 0
    simulated = 0.0
    killed: set[str] = set()
    while simulated < SIMULATED_LIMIT:
        for _ in range(YIELDS):
            await asyncio.sleep(0)
        for worker_id, at in KILLED.items():
            if simulated >= at and worker_id not in killed:
                await crash_consumer(consumers[worker_id])
                killed.add(worker_id)
        if int(simulated / STEP) % int(1 / STEP) == 0:
            now = clock.now()
            for doc in store._tasks.values():  # a read-only scan, for the sampler only
                live = sum(
                    1
                    for e in doc["state"]["worker_states"]
                    if e["status"] == "running" and e["ping_expire_time"] > now
                )
                max_live = max(max_live, live)
            if all(store._tasks[k]["state"]["status"] not in ("pending", "running") for k in shapes):
                break
        clock.advance(timedelta(seconds=STEP))
        simulated += STEP
        assert time.monotonic() - started < REAL_TIME_LIMIT, "the soak ran out of real time"

    statuses = Counter(store._tasks[k]["state"]["status"] for k in shapes)
    wrong = []
    for key, steps in shapes.items():
        if statuses and store._tasks[key]["state"]["status"] == TaskStatus.SUCCEEDED.value:
            if await publisher.wait(key, timeout=1) != model(steps):
                wrong.append(key)
    doubled = []
    for key, steps in shapes.items():
        for step in steps:
            if step.kind == "map":
                source = next(s for s in steps if s.name == step.over)
                items = [k for k in store._tasks if k.startswith(f"{key}/{step.name}/")]
                if len(items) != source.length:
                    doubled.append((key, step.name, len(items), source.length))
    unsettled = [
        k
        for k, doc in store._tasks.items()
        if any(e["status"] == "running" for e in doc["state"]["worker_states"])
    ]
    for worker_id, consumer in consumers.items():
        if worker_id not in killed:
            await consumer.stop(grace=0)
    faults = sum(len(d.faults) for d in drivers.values())
    print(
        f"\nworkflow soak: {N_WORKFLOWS} workflows, {len(store._tasks)} tasks, {faults} injected faults, "
        f"{len(killed)} consumers killed, {simulated:.0f} simulated s, "
        f"{time.monotonic() - started:.1f} real s; "
        f"statuses {dict(statuses)}, max live leases {max_live}, handler runs {sum(runs.values())}"
    )
    assert statuses == {"succeeded": N_WORKFLOWS}, statuses
    assert wrong == [] and doubled == [] and twice == [] and unsettled == []
    assert max_live <= 1
    assert faults > 100 and len(killed) == 3


def _by_task(item: Any, step: Any) -> Any:
    """A handler that runs ``item`` for a map step's items (keys ``<wf>/<step>/<index>``) and
    ``step`` for the other steps."""

    async def handler(params: Any, ctx: TaskContext) -> Any:
        return await (item if ctx.key.count("/") == 2 else step)(params, ctx)

    return handler
