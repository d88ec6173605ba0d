"""Workflows with consumers, on every driver: results that flow between steps, a graph whose
independent steps run at once, a map step fanned out over a list and a join over it (both
failure policies), refused fan-outs, the operators' step controls and a crash mid-item."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from mscheduler import (
    Child,
    Fail,
    InvalidInput,
    Operations,
    Task,
    TaskContext,
    TaskFailed,
    TaskOption,
    TaskStatus,
    TransitionRefused,
)
from mscheduler.domain.family import MapExpansion
from mscheduler.publishing import fan_out
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from tests.consumer.support import Gate, Harness
from tests.helpers import as_driver

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=5),
    retry_delay=timedelta(seconds=1),
    max_unexpected_retries=1,
)


async def until(harness: Harness, done: Callable[[], Awaitable[bool]], limit: int = 60) -> None:
    """Advance the fake clock a second at a time (polls, reconciler passes) until ``done()``."""
    for _ in range(limit):
        if await done():
            return
        await harness.advance(1.0)
    raise AssertionError(f"not done after {limit} fake seconds")


def ended(harness: Harness, key: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await harness.get(key)).status not in (TaskStatus.PENDING, TaskStatus.RUNNING)

    return check


class Steps:
    """Handlers that record what each step received and when it started and ended."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.seen: dict[str, dict[str, Any]] = {}
        self.gates: dict[str, Gate] = {}
        self.fail: set[Any] = set()

    def step(self, name: str, result: Callable[[Any, dict[str, Any]], Any]) -> Any:
        async def handler(params: Any, ctx: TaskContext) -> Any:
            self.log.append(f"start {name}")
            self.seen[ctx.key] = dict(ctx.results)
            if name in self.gates:
                await self.gates[name].wait()
            if name in self.fail or (isinstance(params, int) and params in self.fail):
                raise Fail(f"{name} cannot go on with {params}")
            self.log.append(f"end {name}")
            return result(params, ctx.results)

        return handler


def wf(key: str, *children: Child, **kwargs: Any) -> Task:
    return Task(key, "wf", {"day": 1}, option=OPTION, children=list(children), **kwargs)


async def test_a_chain_passes_each_result_to_the_next_step_and_wait_returns_the_last(
    harness: Harness,
) -> None:
    steps = Steps()
    handlers = {
        "fetch": steps.step("fetch", lambda p, r: {"rows": [3, 1, 2]}),
        "transform": steps.step("transform", lambda p, r: sorted(r["fetch"]["rows"])),
        "load": steps.step("load", lambda p, r: f"loaded {r['transform']}"),
    }
    await harness.start(harness.consumer("w1", handlers, concurrency=3))
    task = wf(
        "chain", Child("fetch"), Child("transform", needs=["fetch"]), Child("load", needs=["transform"])
    )
    assert await harness.publisher.send(task)
    assert not await harness.publisher.send(task)  # idempotent by key, as any family
    await until(harness, ended(harness, "chain"))
    assert await harness.publisher.wait("chain", timeout=1) == "loaded [1, 2, 3]"
    assert steps.log == [
        f"{edge} {name}" for name in ("fetch", "transform", "load") for edge in ("start", "end")
    ]
    assert steps.seen["chain/transform"] == {"fetch": {"rows": [3, 1, 2]}}
    assert steps.seen["chain/load"] == {"transform": [1, 2, 3]}
    assert steps.seen["chain/fetch"] == {}  # needs nothing: no results


async def test_independent_steps_run_at_once_and_the_step_needing_both_gets_both(harness: Harness) -> None:
    steps = Steps()
    gates = {name: steps.gates.setdefault(name, Gate()) for name in ("left", "right")}
    handlers = {
        "root": steps.step("root", lambda p, r: 10),
        "left": steps.step("left", lambda p, r: r["root"] + 1),
        "right": steps.step("right", lambda p, r: r["root"] + 2),
        "both": steps.step("both", lambda p, r: [r["left"], r["right"]]),
    }
    workers = [harness.consumer(f"w{i}", handlers) for i in range(2)]
    await harness.start(*workers)
    await harness.publisher.send(
        wf(
            "dag",
            Child("root"),
            Child("left", needs=["root"]),
            Child("right", needs=["root"]),
            Child("both", needs=["left", "right"]),
        )
    )

    async def both_waiting() -> bool:
        return all(g.waiting == 1 for g in gates.values())

    await until(harness, both_waiting)  # left and right run at the same time, on two workers
    assert (await harness.get("dag/both")).blocked
    for gate in gates.values():
        gate.open()
    await until(harness, ended(harness, "dag"))
    assert await harness.publisher.wait("dag", timeout=1) == [11, 12]
    graph = await Operations(harness.driver, clock=harness.clock).workflow("dag")
    assert [(s.name, s.needs, s.status.value) for s in graph.steps] == [
        ("root", [], "succeeded"),
        ("left", ["root"], "succeeded"),
        ("right", ["root"], "succeeded"),
        ("both", ["left", "right"], "succeeded"),
    ]
    assert graph.final == ["both"] and graph.mode == "graph"


def map_join(key: str, **map_options: Any) -> Task:
    return wf(
        key,
        Child("list"),
        Child("square", map_over="list", **map_options),
        Child("total", needs=["square"]),
    )


def map_handlers(steps: Steps, items: Any) -> dict[str, Any]:
    return {
        "list": steps.step("list", lambda p, r: items),
        "square": steps.step("square", lambda p, r: p * p),
        "total": steps.step("total", lambda p, r: r["square"]),
    }


async def test_a_map_step_runs_one_item_per_element_and_the_join_gets_their_results_in_order(
    harness: Harness,
) -> None:
    steps = Steps()
    await harness.start(harness.consumer("w1", map_handlers(steps, [4, 1, 3, 2, 5]), concurrency=4))
    await harness.publisher.send(map_join("m"))
    await until(harness, ended(harness, "m"))
    assert await harness.publisher.wait("m", timeout=1) == [16, 1, 9, 4, 25]
    assert steps.log.count("start square") == 5 and steps.log[-1] == "end total"
    assert steps.log.index("end list") < steps.log.index("start square")
    assert all(steps.log.index(f"end {n}") < steps.log.index("start total") for n in ("square",))
    item = await harness.get("m/square/2")  # a derived key: <step key>/<index>
    assert item.params == 3 and item.parent == "m/square" and item.status is TaskStatus.SUCCEEDED
    step = await harness.get("m/square")
    assert step.children_mode == "map" and step.items == 5
    graph = await Operations(harness.driver, clock=harness.clock).workflow("m")
    assert graph.steps[1].item_statuses == {"succeeded": 5} and graph.steps[1].map_over == "list"


async def test_a_map_over_an_empty_list_succeeds_at_once_and_the_join_gets_nothing(harness: Harness) -> None:
    steps = Steps()
    await harness.start(harness.consumer("w1", map_handlers(steps, []), concurrency=2))
    await harness.publisher.send(map_join("empty"))
    await until(harness, ended(harness, "empty"))
    assert await harness.publisher.wait("empty", timeout=1) == []
    assert "start square" not in steps.log


async def test_a_fan_out_done_twice_makes_no_item_twice(harness: Harness) -> None:
    steps = Steps()
    steps.gates["square"] = Gate()  # items wait: the second fan-out meets them pending / running
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2, 3]), concurrency=4))
    await harness.publisher.send(map_join("twice"))

    async def fanned() -> bool:
        return steps.gates["square"].waiting == 3

    await until(harness, fanned)
    # a retried fan-out (a crash before the step was recorded fanned out): the same keys again
    expansion = MapExpansion("twice/square", "twice/list", 10, "twice")
    assert not await fan_out(harness.driver, expansion, harness.clock.now())
    listed = await Operations(harness.driver, clock=harness.clock).list_tasks(key_prefix="twice/square/")
    assert [t.key for t in listed] == ["twice/square/0", "twice/square/1", "twice/square/2"]
    steps.gates["square"].open()
    await until(harness, ended(harness, "twice"))
    assert steps.log.count("start square") == 3


async def test_an_item_failing_fails_the_workflow_by_default(harness: Harness) -> None:
    steps = Steps()
    steps.fail.add(2)
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2, 3]), concurrency=4))
    await harness.publisher.send(map_join("strict"))
    await until(harness, ended(harness, "strict"))
    assert (await harness.get("strict")).status is TaskStatus.FAILED
    assert "start total" not in steps.log  # the join never ran
    with pytest.raises(TaskFailed, match=r"child 'square' \(strict/square, item strict/square/1\) failed"):
        await harness.publisher.wait("strict", timeout=1)


async def test_on_failure_continue_runs_the_join_with_what_succeeded(harness: Harness) -> None:
    steps = Steps()
    steps.fail.add(2)
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2, 3]), concurrency=4))
    await harness.publisher.send(map_join("lenient", on_failure="continue"))
    await until(harness, ended(harness, "lenient"))
    assert await harness.publisher.wait("lenient", timeout=1) == [1, 9]
    assert (await harness.get("lenient/square/1")).status is TaskStatus.FAILED


@pytest.mark.parametrize(
    ("items", "reason"),
    [({"not": "a list"}, "a dict, not a list"), (list(range(4)), "4 items, more than max_items 3")],
)
async def test_a_fan_out_over_a_non_list_or_too_many_items_fails_the_step(
    harness: Harness, items: Any, reason: str
) -> None:
    steps = Steps()
    await harness.start(harness.consumer("w1", map_handlers(steps, items), concurrency=2))
    await harness.publisher.send(map_join("refused", max_items=3))
    await until(harness, ended(harness, "refused"))
    step = await harness.get("refused/square")
    assert step.status is TaskStatus.FAILED and reason in (step.marked or {}).get("reason", "")
    assert "start square" not in steps.log
    with pytest.raises(TaskFailed, match=reason):
        await harness.publisher.wait("refused", timeout=1)


class Inputs(BaseModel):
    fetch: list[int]


class SumParams(BaseModel):
    scale: int
    results: Inputs


async def test_a_params_model_with_results_gets_them_typed(harness: Harness) -> None:
    seen: list[SumParams] = []

    async def fetch(params: Any) -> list[int]:
        return [1, 2, 3]

    async def add(params: SumParams) -> int:
        seen.append(params)
        return params.scale * sum(params.results.fetch)

    await harness.start(harness.consumer("w1", {"fetch": fetch, "add": add}))
    task = Task(
        "typed", "wf", {"scale": 10}, option=OPTION, children=[Child("fetch"), Child("add", needs=["fetch"])]
    )
    await harness.publisher.send(task)
    await until(harness, ended(harness, "typed"))
    assert await harness.publisher.wait("typed", timeout=1) == 60
    assert seen == [SumParams(scale=10, results=Inputs(fetch=[1, 2, 3]))]


async def test_restart_step_reruns_it_and_what_depends_on_it(harness: Harness) -> None:
    steps = Steps()
    runs = {"n": 0}

    def count(p: Any, r: Any) -> int:
        runs["n"] += 1
        return runs["n"]

    handlers = {
        "a": steps.step("a", lambda p, r: "a"),
        "b": steps.step("b", count),
        "c": steps.step("c", lambda p, r: r["b"]),
        "d": steps.step("d", lambda p, r: "d"),
    }
    await harness.start(harness.consumer("w1", handlers, concurrency=2))
    task = wf("re", Child("a"), Child("b", needs=["a"]), Child("c", needs=["b"]), Child("d", needs=["a"]))
    await harness.publisher.send(task)
    await until(harness, ended(harness, "re"))
    assert await harness.publisher.wait("re", timeout=1) == {"c": 1, "d": "d"}
    ops = Operations(harness.driver, clock=harness.clock)
    graph = await ops.restart_step("re", "b")
    assert {s.name: s.status.value for s in graph.steps}["a"] == "succeeded"
    await until(harness, ended(harness, "re"))
    assert await harness.publisher.wait("re", timeout=1) == {"c": 2, "d": "d"}
    assert steps.log.count("start a") == 1 and steps.log.count("start d") == 1
    assert steps.log.count("start b") == 2 and steps.log.count("start c") == 2
    with pytest.raises(InvalidInput, match="no step named 'x'"):
        await ops.restart_step("re", "x")


async def test_restart_step_of_a_map_fans_out_again_and_refuses_while_a_dependent_runs(
    harness: Harness,
) -> None:
    steps = Steps()
    items = [[1, 2], [3]]
    calls = {"n": 0}

    def listing(p: Any, r: Any) -> list[int]:
        calls["n"] += 1
        return items[min(calls["n"], 2) - 1]

    handlers = map_handlers(steps, None) | {"list": steps.step("list", listing)}
    await harness.start(harness.consumer("w1", handlers, concurrency=3))
    await harness.publisher.send(map_join("rm"))
    await until(harness, ended(harness, "rm"))
    assert await harness.publisher.wait("rm", timeout=1) == [1, 4]
    ops = Operations(harness.driver, clock=harness.clock)
    steps.gates["total"] = Gate()
    await ops.restart_step("rm", "list")

    async def total_waiting() -> bool:
        return steps.gates["total"].waiting == 1

    await until(harness, total_waiting)
    with pytest.raises(TransitionRefused, match="depends on 'list' and runs"):
        await ops.restart_step("rm", "list")
    steps.gates["total"].open()
    await until(harness, ended(harness, "rm"))
    assert await harness.publisher.wait("rm", timeout=1) == [9]
    assert (await harness.get("rm/square")).items == 1
    assert [t.key for t in await ops.list_tasks(key_prefix="rm/square/")] == ["rm/square/0"]


async def test_cancelling_a_workflow_cancels_its_items(harness: Harness) -> None:
    steps = Steps()
    steps.gates["square"] = Gate()
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2, 3]), concurrency=2))
    await harness.publisher.send(map_join("cx"))

    async def running_items() -> bool:
        return steps.gates["square"].waiting == 2

    await until(harness, running_items)
    ops = Operations(harness.driver, clock=harness.clock)
    await ops.cancel("cx", "enough")
    await until(harness, ended(harness, "cx/square/0"))
    statuses = {t.key: t.status.value for t in await ops.list_tasks(key_prefix="cx/square/")}
    assert statuses == dict.fromkeys(["cx/square/0", "cx/square/1", "cx/square/2"], "cancelled")
    assert (await harness.get("cx/total")).status is TaskStatus.CANCELLED
    assert "start total" not in steps.log


async def test_a_crash_mid_item_reruns_that_item_only_and_the_join_still_runs(harness: Harness) -> None:
    steps = Steps()
    steps.gates["square"] = Gate()
    a = harness.consumer(
        "A", map_handlers(steps, [1, 2]), driver=as_driver(FaultyDriver(harness.new_driver())), concurrency=1
    )
    await harness.start(a)
    await harness.publisher.send(map_join("crash"))

    async def one_running() -> bool:
        return steps.gates["square"].waiting == 1

    await until(harness, one_running)
    await crash_consumer(a)
    harness.consumers.remove(a)
    del steps.gates["square"]
    b = harness.consumer("B", map_handlers(steps, [1, 2]), concurrency=2)
    await harness.start(b)
    await until(harness, ended(harness, "crash"))
    assert await harness.publisher.wait("crash", timeout=1) == [1, 4]
    assert steps.log.count("start list") == 1 and steps.log.count("start total") == 1
    assert steps.log.count("start square") == 3  # two items, one of them again after the crash


async def test_a_step_whose_need_is_restarted_under_it_is_put_back_not_run(harness: Harness) -> None:
    steps = Steps()
    handlers = {"a": steps.step("a", lambda p, r: 1), "b": steps.step("b", lambda p, r: r["a"])}
    await harness.start(harness.consumer("w1", handlers))
    await harness.publisher.send(wf("race", Child("a"), Child("b", needs=["a"])))
    await until(harness, ended(harness, "race"))
    # b is claimed while a is not succeeded (restarted between b's unblocking and its claim)
    consumer = harness.consumers[0]
    claimed = type("C", (), {"needs": [{"name": "a", "key": "race/a"}], "key": "race/b"})()
    await Operations(harness.driver, clock=harness.clock).restart_step("race", "a")
    results = asyncio.ensure_future(consumer._step_results(claimed))
    with pytest.raises(Exception, match=r"step .a. it needs is (pending|running), not succeeded"):
        await results


async def test_a_plan_starts_a_workflow_on_its_schedule(harness: Harness) -> None:
    from mscheduler import EverySchedule, Plan, PlanTiming

    steps = Steps()
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2]), concurrency=3, planner=True))
    ops = Operations(harness.driver, clock=harness.clock)
    children = [
        Child("list"),
        Child("square", map_over="list", option=TaskOption(max_unexpected_retries=2)),
        Child("total", needs=["square"]),
    ]
    timing = PlanTiming(schedule=EverySchedule(interval=60, start=harness.clock.now()))
    info = await ops.add_plan(Plan(plan_id="squares", name="squares", timing=timing, children=children))
    assert info.children is not None and info.children[1].map_over == "list"
    assert info.children[1].option == TaskOption(max_unexpected_retries=2)  # kept as stored
    with pytest.raises(InvalidInput, match="form a cycle"):
        Plan(
            plan_id="bad",
            name="x",
            timing=timing,
            children=[Child("a", needs=["b"]), Child("b", needs=["a"])],
        )

    async def run_done() -> bool:
        plan = await ops.get_plan("squares")
        return (
            plan.last_run_key is not None
            and (await harness.get(plan.last_run_key)).status is TaskStatus.SUCCEEDED
        )

    await until(harness, run_done)
    plan = await ops.get_plan("squares")
    assert plan.last_run_key is not None
    assert await harness.publisher.wait(plan.last_run_key, timeout=1) == [1, 4]
    graph = await ops.workflow(plan.last_run_key)
    assert [s.name for s in graph.steps] == ["list", "square", "total"]
    now_run = await ops.run_plan_now("squares")  # outside the schedule: a workflow too
    assert now_run.children_mode == "graph"


async def test_removing_a_workflow_removes_its_map_steps_items_and_so_does_retention(
    harness: Harness,
) -> None:
    from mscheduler.drivers.base import PurgeParams

    steps = Steps()
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2, 3]), concurrency=3))
    ops = Operations(harness.driver, clock=harness.clock)
    for key in ("gone", "aged"):
        await harness.publisher.send(map_join(key))
        await until(harness, ended(harness, key))
    await ops.remove("gone")
    assert await ops.list_tasks(key_prefix="gone") == []
    later = harness.clock.now() + timedelta(days=1)
    assert await harness.driver.purge_finished(PurgeParams("succeeded", later, 100)) == 1
    assert await ops.list_tasks(key_prefix="aged") == []


async def test_restarting_a_failed_workflow_reruns_the_failed_step_then_what_needs_it(
    harness: Harness,
) -> None:
    steps = Steps()
    steps.fail.add("b")
    handlers = {
        "a": steps.step("a", lambda p, r: 1),
        "b": steps.step("b", lambda p, r: r["a"] + 1),
        "c": steps.step("c", lambda p, r: r["b"] + 1),
    }
    await harness.start(harness.consumer("w1", handlers, concurrency=2))
    await harness.publisher.send(wf("rf", Child("a"), Child("b", needs=["a"]), Child("c", needs=["b"])))
    await until(harness, ended(harness, "rf"))
    assert (await harness.get("rf")).status is TaskStatus.FAILED
    assert (await harness.get("rf/c")).blocked and "start c" not in steps.log
    steps.fail.clear()
    await Operations(harness.driver, clock=harness.clock).restart("rf")
    await until(harness, ended(harness, "rf"))
    assert await harness.publisher.wait("rf", timeout=1) == 3
    assert steps.log.count("start a") == 1 and steps.log.count("start b") == 2


async def test_a_paused_workflow_starts_no_step_and_fans_out_nothing_until_resumed(harness: Harness) -> None:
    steps = Steps()
    steps.gates["list"] = Gate()
    await harness.start(harness.consumer("w1", map_handlers(steps, [1, 2]), concurrency=3))
    await harness.publisher.send(map_join("pz"))

    async def listing() -> bool:
        return steps.gates["list"].waiting == 1

    await until(harness, listing)
    ops = Operations(harness.driver, clock=harness.clock)
    await ops.pause("pz")
    steps.gates["list"].open()  # the running step finishes; nothing after it starts
    await until(harness, lambda: _succeeded(harness, "pz/list"))
    await harness.advance(30.0)
    assert "start square" not in steps.log and await ops.list_tasks(key_prefix="pz/square/") == []
    await ops.resume("pz")
    await until(harness, ended(harness, "pz"))
    assert await harness.publisher.wait("pz", timeout=1) == [1, 4]


async def _succeeded(harness: Harness, key: str) -> bool:
    return (await harness.get(key)).status is TaskStatus.SUCCEEDED


async def test_restart_step_of_the_map_step_itself_runs_its_items_again(harness: Harness) -> None:
    steps = Steps()
    await harness.start(harness.consumer("w1", map_handlers(steps, [2, 3]), concurrency=3))
    await harness.publisher.send(map_join("rs"))
    await until(harness, ended(harness, "rs"))
    graph = await Operations(harness.driver, clock=harness.clock).restart_step("rs", "square")
    assert graph.steps[1].status is not TaskStatus.SUCCEEDED
    await until(harness, ended(harness, "rs"))
    assert await harness.publisher.wait("rs", timeout=1) == [4, 9]
    assert steps.log.count("start square") == 4 and steps.log.count("start list") == 1
    assert steps.log.count("start total") == 2
