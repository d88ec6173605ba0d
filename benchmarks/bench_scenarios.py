"""One benchmark scenario, run in this process, printed as one JSON line: the unit ``compare`` runs.

Self-contained on purpose: stdlib plus mscheduler's public API (``from mscheduler import ...``)
only, so the same script runs against any build put first on ``PYTHONPATH`` (the core build
d2dc2c2 exports far fewer names than today's; features a build lacks are reported as
``{"skipped": reason}``, never as a failure). Figures mirror ``burn_down.py`` /
``burn_down_latency.py``: a burn-down publishes no-op tasks first (not timed), then one
``Consumer`` (concurrency 30) runs them; tasks/s is counted from the first claim to the last
recorded success.

    PYTHONPATH=/path/to/build python benchmarks/bench_scenarios.py SCENARIO [--tasks 10000]

Scenarios: ``burn_down``, ``burn_down_rtt`` (every driver request waits 1 ms first),
``send_many`` (batches of 1,000), ``send`` (one task per call), and the feature variants
``burn_down_events``, ``burn_down_limit``, ``burn_down_plans``, ``burn_down_children``,
``burn_down_fair`` (every task carries one of 10 fairness keys: the claims rotate across them).
``commands_per_task`` is given where it can be counted without slowing the figure: in
``burn_down_rtt``, whose wrapper counts the consumer's driver requests (not MongoDB commands).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import resource
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import mscheduler
from mscheduler import Consumer, MemoryDriver, Publisher, Task, TaskOption

TASK_NAME = "noop"
PUBLISH_BATCH = 1000
CONCURRENCY = 30
RTT_SECONDS = 0.001
PLAN_COUNT = 5
PLAN_TASK_NAME = "tick"
CHILD_NAMES = ("step-a", "step-b")


class Skipped(Exception):
    """The build lacks what the scenario needs: reported as ``"skipped"``, not as an error."""


class LatencyDriver:
    """Delegates to ``inner``, awaiting ``delay`` seconds before each request: a simulated round trip.

    Generic: every coroutine method of the inner driver is wrapped when first looked up, whatever
    the build's driver protocol has; an async generator (the change stream, ``watch``) waits once
    when it opens, then passes its events straight through as a server pushes them. Plain
    attributes (``clock``, flags) pass through. Neither build's ``Consumer`` or ``Publisher``
    checks ``isinstance(driver, Driver)``, so a delegator is accepted as it is.
    """

    def __init__(self, inner: Any, delay: float = RTT_SECONDS) -> None:
        self.inner = inner
        self.delay = delay
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if inspect.isasyncgenfunction(target):
            wrapped: Callable[..., Any] = self._stream(target)
        elif inspect.iscoroutinefunction(target):
            wrapped = self._request(target)
        else:
            return target
        setattr(self, name, wrapped)  # built once per operation, not per call
        return wrapped

    def _request(self, target: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def request(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            await asyncio.sleep(self.delay)
            return await target(*args, **kwargs)

        return request

    def _stream(self, target: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            self.calls += 1
            await asyncio.sleep(self.delay)
            async for item in target(*args, **kwargs):
                yield item

        return stream


@dataclass(slots=True)
class BurnDown:
    """Timestamps of one burn-down, as ``benchmarks/common.py``'s: first claim, then each outcome.

    Only keys starting with ``prefix`` count, so a plan's occurrences run beside the burn-down
    without being in its figure.
    """

    expected: int
    prefix: str = "task-"
    first_claim: float | None = None
    last_finish: float = 0.0
    finished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    others: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def listener(self, event: str, data: dict[str, Any]) -> None:
        if event == "claimed":
            if self.first_claim is None:
                self.first_claim = time.perf_counter()
        elif event == "finished":
            if not str(data.get("key", "")).startswith(self.prefix):
                self.others += 1
                return
            self.last_finish = time.perf_counter()
            self.finished += 1
            outcome = str(data.get("outcome"))
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if self.finished >= self.expected:
                self.done.set()

    @property
    def seconds(self) -> float:
        if self.first_claim is None or not self.finished:
            raise RuntimeError("nothing was claimed or finished")
        return self.last_finish - self.first_claim


async def noop_handler() -> None:
    return None


def noop_tasks(count: int, start: int = 0) -> list[Task]:
    return [Task(f"task-{i}", TASK_NAME) for i in range(start, start + count)]


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def public(name: str) -> Any:
    """``from mscheduler import name``, or ``Skipped`` naming what this build lacks."""
    try:
        return getattr(mscheduler, name)
    except AttributeError:
        raise Skipped(f"mscheduler exports no {name}") from None


async def publish(publisher: Any, tasks: list[Task]) -> None:
    for start in range(0, len(tasks), PUBLISH_BATCH):
        await publisher.send_many(tasks[start : start + PUBLISH_BATCH])


async def burn_down(
    driver: Any,
    tasks: list[Task],
    *,
    expected: int,
    handlers: dict[str, Callable[[], Awaitable[None]]],
    timeout: float,
    before_consuming: Callable[[], Awaitable[None]] | None = None,
) -> tuple[BurnDown, Any]:
    """Publish ``tasks`` (not timed), then run one consumer until ``expected`` outcomes are in."""
    await publish(Publisher(driver), tasks)
    if before_consuming is not None:
        await before_consuming()
    consumer = Consumer(driver, concurrency=CONCURRENCY)
    for name, handler in handlers.items():
        consumer.register(name, handler)
    run = BurnDown(expected=expected)
    consumer.add_listener(run.listener)
    async with consumer:
        await asyncio.wait_for(run.done.wait(), timeout=timeout)
    if run.outcomes != {"succeeded": expected}:
        raise RuntimeError(f"not every task succeeded: {run.outcomes}")
    return run, consumer


def burn_down_result(run: BurnDown, tasks: int) -> dict[str, Any]:
    return {"tasks": tasks, "tasks_per_s": round(tasks / run.seconds), "seconds": round(run.seconds, 3)}


async def scenario_burn_down(tasks: int, timeout: float) -> dict[str, Any]:
    run, _ = await burn_down(
        MemoryDriver(), noop_tasks(tasks), expected=tasks, handlers={TASK_NAME: noop_handler}, timeout=timeout
    )
    return burn_down_result(run, tasks)


async def scenario_burn_down_rtt(tasks: int, timeout: float) -> dict[str, Any]:
    driver = LatencyDriver(MemoryDriver())
    calls_published = 0

    async def count_published() -> None:
        nonlocal calls_published
        calls_published = driver.calls

    run, _ = await burn_down(
        driver,
        noop_tasks(tasks),
        expected=tasks,
        handlers={TASK_NAME: noop_handler},
        timeout=timeout,
        before_consuming=count_published,
    )
    consumer_calls = driver.calls - calls_published
    return {
        **burn_down_result(run, tasks),
        "rtt_ms": RTT_SECONDS * 1000,
        "driver_calls": driver.calls,
        # The consumer's driver requests (claims, finishes, pings, polls, start-up, stop) per task:
        # calls into the driver, not MongoDB commands (one memory claim call carries up to
        # max_claim_batch attempts, each a command on MongoDB; benchmarks/commands_per_task.py
        # counts those).
        "commands_per_task": round(consumer_calls / tasks, 3),
    }


async def scenario_send_many(tasks: int, timeout: float) -> dict[str, Any]:
    publisher = Publisher(MemoryDriver())
    batch = noop_tasks(tasks)
    started = time.perf_counter()
    await asyncio.wait_for(publish(publisher, batch), timeout=timeout)
    seconds = time.perf_counter() - started
    return {"tasks": tasks, "tasks_per_s": round(tasks / seconds), "seconds": round(seconds, 3)}


async def scenario_send(tasks: int, timeout: float) -> dict[str, Any]:
    publisher = Publisher(MemoryDriver())
    batch = noop_tasks(tasks)

    async def send_all() -> None:
        for task in batch:
            await publisher.send(task)

    started = time.perf_counter()
    await asyncio.wait_for(send_all(), timeout=timeout)
    seconds = time.perf_counter() - started
    return {"tasks": tasks, "tasks_per_s": round(tasks / seconds), "seconds": round(seconds, 3)}


async def scenario_burn_down_events(tasks: int, timeout: float) -> dict[str, Any]:
    if "events" not in inspect.signature(MemoryDriver).parameters:
        raise Skipped("MemoryDriver takes no events=True (no event log in this build)")
    run, _ = await burn_down(
        MemoryDriver(events=True),
        noop_tasks(tasks),
        expected=tasks,
        handlers={TASK_NAME: noop_handler},
        timeout=timeout,
    )
    return burn_down_result(run, tasks)


async def scenario_burn_down_limit(tasks: int, timeout: float) -> dict[str, Any]:
    operations = public("Operations")
    if not hasattr(operations, "set_limit"):
        raise Skipped("Operations has no set_limit (no flow limits in this build)")
    driver = MemoryDriver()
    # Above the concurrency, so never reached: the run measures what taking the slots costs.
    await operations(driver).set_limit(TASK_NAME, max_running=1000)
    run, _ = await burn_down(
        driver, noop_tasks(tasks), expected=tasks, handlers={TASK_NAME: noop_handler}, timeout=timeout
    )
    return {**burn_down_result(run, tasks), "limit_max_running": 1000}


async def scenario_burn_down_plans(tasks: int, timeout: float) -> dict[str, Any]:
    plan, plan_timing, operations = public("Plan"), public("PlanTiming"), public("Operations")
    if not hasattr(operations, "add_plan"):
        raise Skipped("Operations has no add_plan")
    driver = MemoryDriver()
    ops = operations(driver)

    async def add_plans() -> None:
        # A new plan's first occurrence is the first one at or after its creation, so the schedule
        # starts just after now; the consumer starts once it has passed, and its planner's first
        # pass (at start-up) makes the first runs: a 10,000-task burn-down lasts under a second.
        start = datetime.now(UTC) + timedelta(milliseconds=20)
        # The schedule as its stored form: EverySchedule itself is only reachable by a deep path.
        timing = plan_timing(schedule={"kind": "every", "interval": timedelta(seconds=1), "start": start})
        # Priority 1: each occurrence is claimed before the backlog, so it runs during the burn-down.
        option = TaskOption(priority=1)
        for i in range(PLAN_COUNT):
            await ops.add_plan(plan(plan_id=f"bench-{i}", name=PLAN_TASK_NAME, option=option, timing=timing))
        await asyncio.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + 0.002)

    run, _ = await burn_down(
        driver,
        noop_tasks(tasks),
        expected=tasks,
        handlers={TASK_NAME: noop_handler, PLAN_TASK_NAME: noop_handler},
        timeout=timeout,
        before_consuming=add_plans,
    )
    return {**burn_down_result(run, tasks), "plans": PLAN_COUNT, "plan_runs": run.others}


async def scenario_burn_down_children(tasks: int, timeout: float) -> dict[str, Any]:
    public("Child")
    if "children" not in getattr(Task, "model_fields", {}):
        raise Skipped("Task has no children field")
    parents = [Task(f"task-{i}", "parent", children=list(CHILD_NAMES)) for i in range(tasks)]
    runs = tasks * len(CHILD_NAMES)
    run, _ = await burn_down(
        MemoryDriver(),
        parents,
        expected=runs,
        handlers=dict.fromkeys(CHILD_NAMES, noop_handler),
        timeout=timeout,
    )
    # tasks/s counts parents (the tasks published); each ran its two steps in order.
    return {**burn_down_result(run, tasks), "child_runs": runs, "runs_per_s": round(runs / run.seconds)}


FAIR_KEYS = 10


async def scenario_burn_down_fair(tasks: int, timeout: float) -> dict[str, Any]:
    if "fair_key" not in getattr(TaskOption, "model_fields", {}):
        raise Skipped("TaskOption has no fair_key (no fairness in this build)")
    options = [TaskOption(fair_key=f"tenant-{k}") for k in range(FAIR_KEYS)]
    keyed = [Task(f"task-{i}", TASK_NAME, option=options[i % FAIR_KEYS]) for i in range(tasks)]
    run, _ = await burn_down(
        MemoryDriver(), keyed, expected=tasks, handlers={TASK_NAME: noop_handler}, timeout=timeout
    )
    return {**burn_down_result(run, tasks), "fair_keys": FAIR_KEYS}


SCENARIOS: dict[str, Callable[[int, float], Awaitable[dict[str, Any]]]] = {
    "burn_down": scenario_burn_down,
    "burn_down_rtt": scenario_burn_down_rtt,
    "send_many": scenario_send_many,
    "send": scenario_send,
    "burn_down_events": scenario_burn_down_events,
    "burn_down_limit": scenario_burn_down_limit,
    "burn_down_plans": scenario_burn_down_plans,
    "burn_down_children": scenario_burn_down_children,
    "burn_down_fair": scenario_burn_down_fair,
}


async def run_scenario(name: str, tasks: int, timeout: float) -> dict[str, Any]:
    """The scenario's JSON line: its figures, or ``skipped`` with the reason."""
    gc.collect()
    result: dict[str, Any] = {"scenario": name, "tasks": tasks}
    try:
        result.update(await SCENARIOS[name](tasks, timeout))
    except Skipped as exc:
        result["skipped"] = str(exc)
    result["peak_rss_mib"] = round(peak_rss_mib(), 1)
    result["mscheduler_file"] = mscheduler.__file__
    result["python"] = sys.version.split()[0]
    return result


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the timed part")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run_scenario(args.scenario, args.tasks, args.timeout))), flush=True)


if __name__ == "__main__":
    cli()
