"""Model-based test of workflows under crashes, on the memory driver and the Mongo driver on
mongomock: random DAGs (plain steps, list steps, map steps over them and joins), run by real
consumers on a fake clock; one consumer is killed at a chosen point — during a step, between a
step's finish and its follow-up (the parent's sync), during a fan-out's insert (after the items
were written, before the step was recorded fanned out), while a fan-out is recorded, during the
join's read of its inputs — and a second consumer carries on.

The model is the DAG evaluated in Python: every workflow must end succeeded with the model's
result (nothing lost), every map step must have exactly one item per element (no fan-out twice),
and no task may ever hold two live leases or run in two handlers at once (sampled every
simulated second, and checked at each handler's start).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    Child,
    Consumer,
    FakeClock,
    Operations,
    Publisher,
    Task,
    TaskContext,
    TaskOption,
    TaskStatus,
)
from mscheduler.drivers.base import Driver
from mscheduler.testing.faults import DriverKilled, FaultyDriver, crash_consumer
from tests.conftest import driver_factory
from tests.consumer.support import Gate, settle
from tests.helpers import as_driver

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=4),
    retry_delay=timedelta(seconds=1),
    max_unexpected_retries=10,
)
# where consumer A dies: (operation, after it was applied?) or "handler" (mid-step)
CRASH_POINTS = [
    ("handler", False),
    ("sync_parents", False),  # a step's finish is stored, its follow-up is not
    ("insert_tasks", True),  # a fan-out's items are stored, the step is not recorded fanned out
    ("expand_map", False),
    ("read_results", False),  # a step that needs others (a join) dies reading its inputs
    ("finish", True),
]
CASES = 12


@dataclass
class Step:
    name: str
    kind: str  # "value", "list" or "map"
    needs: list[str] = field(default_factory=list)
    over: str | None = None
    length: int = 0


def random_dag(rng: random.Random) -> list[Step]:
    """3 to 7 steps, each needing some earlier ones; the first is a list step, a map step maps
    over an earlier list step, and the last needs a map step (a join)."""
    steps: list[Step] = [Step("s0", "list", length=rng.randint(1, 4))]
    for i in range(1, rng.randint(3, 7)):
        name = f"s{i}"
        lists = [s.name for s in steps if s.kind == "list"]
        maps = [s.name for s in steps if s.kind == "map"]
        roll = rng.random()
        if not maps or roll < 0.3:
            steps.append(Step(name, "map", over=rng.choice(lists)))
        elif roll < 0.5:
            needs = rng.sample([s.name for s in steps], k=rng.randint(0, min(2, len(steps))))
            steps.append(Step(name, "list", needs=sorted(needs), length=rng.randint(0, 4)))
        else:
            needs = rng.sample([s.name for s in steps], k=rng.randint(0, min(3, len(steps))))
            steps.append(Step(name, "value", needs=sorted(needs)))
    others = [s.name for s in steps]
    steps.append(
        Step(f"s{len(steps)}", "value", needs=sorted({rng.choice(maps or others), rng.choice(others)}))
    )
    return steps


def total(value: Any) -> int:
    if isinstance(value, list):
        return sum(total(v) for v in value)
    return int(value)


def step_result(step: Step, inputs: dict[str, Any]) -> Any:
    """What a step returns given its inputs: the handlers and the model share this rule."""
    base = sum(total(inputs[n]) for n in step.needs) + int(step.name[1:]) * 7
    if step.kind == "list":
        return [(base + k) % 10 for k in range(step.length)]
    return base % 1000


def item_result(item: int) -> int:
    return item * 2 + 1


def model(steps: list[Step]) -> Any:
    """The workflow's result, evaluated in Python: its final steps' (one: its result)."""
    results: dict[str, Any] = {}
    for step in steps:
        if step.kind == "map":
            assert step.over is not None
            results[step.name] = [item_result(i) for i in results[step.over]]
        else:
            results[step.name] = step_result(step, {n: results[n] for n in step.needs})
    needed = {n for s in steps for n in (*s.needs, *((s.over,) if s.over else ()))}
    finals = [s.name for s in steps if s.name not in needed]
    return results[finals[0]] if len(finals) == 1 else {n: results[n] for n in finals}


class CrashingDriver(FaultyDriver):
    """Dies (``kill``) at the first call of ``op``, before or after the store applied it."""

    def __init__(self, inner: Driver, op: str, after_apply: bool) -> None:
        super().__init__(inner)
        self.op, self.after_apply = op, after_apply
        self.crashed = False

    async def _invoke(self, op: str, call: Callable[[], Awaitable[Any]], *args: Any) -> Any:
        if op == self.op and not self.crashed and not self.killed:
            self.crashed = True
            if self.after_apply:
                await super()._invoke(op, call, *args)
            self.kill()
            raise DriverKilled(f"{op}: crashed here on purpose")
        return await super()._invoke(op, call, *args)


class Run:
    """Handlers for one case's steps that check no task runs in two handlers at once."""

    def __init__(self, steps: list[Step], hold: str | None) -> None:
        self.steps = steps
        self.running: set[str] = set()
        self.twice: list[str] = []
        self.hold = hold  # a step whose first run waits on ``gate`` (the mid-step crash)
        self.gate = Gate()

    def handlers(self) -> dict[str, Any]:
        out = {}
        for step in self.steps:
            out[step.name] = self._handler(step)
        return out

    def _handler(self, step: Step) -> Any:
        async def handler(params: Any, ctx: TaskContext) -> Any:
            if ctx.key in self.running:
                self.twice.append(ctx.key)
            self.running.add(ctx.key)
            try:
                if step.name == self.hold:
                    self.hold = None
                    await self.gate.wait()
                if step.kind == "map":
                    return item_result(params)
                return step_result(step, ctx.results)
            finally:
                self.running.discard(ctx.key)

        return handler


def workflow(key: str, steps: list[Step]) -> Task:
    children = [
        Child(s.name, map_over=s.over) if s.kind == "map" else Child(s.name, needs=s.needs) for s in steps
    ]
    return Task(key, "wf", option=OPTION, children=children, children_mode="graph")


async def live_leases(ops: Operations, key: str, now: Any) -> int:
    """The most running, unexpired entries one task of the workflow holds."""
    most = 0
    for task in await ops.list_tasks(key_prefix=f"{key}/", limit=1000):
        live = [w for w in task.worker_states if w.status.value == "running" and w.ping_expire_time > now]
        most = max(most, len(live))
    return most


async def run_case(kind: str, seed: int) -> None:
    rng = random.Random(seed)
    steps = random_dag(rng)
    op, after_apply = CRASH_POINTS[seed % len(CRASH_POINTS)]
    clock = FakeClock()
    async for factory in driver_factory(kind):
        run = Run(steps, rng.choice([s.name for s in steps]) if op == "handler" else None)
        a_driver = CrashingDriver(factory(clock), op if op != "handler" else "-", after_apply)
        options: dict[str, Any] = {"poll_interval": 1.0, "concurrency": 3, "children_interval": 2.0}
        a = Consumer(as_driver(a_driver), worker_id="A", clock=clock, **options)
        b = Consumer(factory(clock), worker_id="B", clock=clock, **options)
        for name, fn in run.handlers().items():
            a.register(name, fn)
            b.register(name, fn)
        publisher = Publisher(factory(clock), clock=clock)
        ops = Operations(factory(clock), clock=clock)
        await a.start()
        await publisher.send(workflow("wf", steps))
        b_started = a_crashed = False
        try:
            for second in range(240):
                await settle()
                if op == "handler" and run.gate.waiting and not a_driver.killed:
                    await crash_consumer(a)  # mid-step: the handler dies with its process
                    a_crashed = True
                elif a_driver.killed and not a_crashed:
                    await crash_consumer(a)  # it died at the chosen point: tidy up what is left
                    a_crashed = True
                if not b_started and (a_driver.killed or second >= 20):
                    await b.start()
                    b_started = True
                assert await live_leases(ops, "wf", clock.now()) <= 1
                if (await ops.get_task("wf")).status not in (TaskStatus.PENDING, TaskStatus.RUNNING):
                    break
                clock.advance(timedelta(seconds=1))
            info = await ops.get_task("wf")
            assert info.status is TaskStatus.SUCCEEDED, (seed, op, steps, info.children)
            assert await publisher.wait("wf", timeout=1) == model(steps)
            assert not run.twice
            assert a_crashed, "consumer A never reached its crash point"
            for step in steps:
                if step.kind == "map":
                    assert step.over is not None
                    source = next(s for s in steps if s.name == step.over)
                    items = await ops.list_tasks(key_prefix=f"wf/{step.name}/", limit=100)
                    assert len(items) == source.length, (seed, step)
        finally:
            if a_driver.killed and not a_crashed:
                await crash_consumer(a)
            for consumer in (a, b) if not a_driver.killed else (b,):
                if consumer._side:
                    await consumer.stop(grace=0)


@pytest.mark.parametrize("kind", ["memory", "mongomock"])
@pytest.mark.parametrize("seed", range(CASES))
async def test_random_workflows_survive_a_crash_anywhere(kind: str, seed: int) -> None:
    await run_case(kind, seed)
