"""Planners racing over shared plans on a FakeClock (memory and mongomock).

Ten planners (one per simulated consumer) share one store; each gets a thin wrapper that yields
to the event loop before every storage call, so their passes interleave (all read, then all
insert, then all compare-and-set) instead of running one after another. mongomock scans its
collections on every operation, so the mongomock run of the many-plans test uses 12 plans over
one day (200 over two days on memory).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import TaskOption
from mscheduler.domain.plans import Plan, PlanState, occurrence_key
from mscheduler.domain.schedule import (
    AtSchedule,
    CatchUp,
    CronSchedule,
    EverySchedule,
    PlanTiming,
    WeeklySchedule,
    iter_occurrences,
)
from mscheduler.drivers.base import ClaimParams, Driver, FinishParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.operations import Operations
from mscheduler.services.planner import Planner
from mscheduler.testing.clock import FakeClock
from tests.conftest import DriverFactory

START = datetime(2030, 3, 1, 0, 0, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
NO_RETRY = TaskOption(max_unexpected_retries=0)
# plans and simulated days of the many-planners test: mongomock scans on every command
SIZES = {"memory": 200, "mongomock": 12}
DAYS = {"memory": 2, "mongomock": 1}


class Yielding:
    """Delegates every call to the shared store after one trip round the event loop."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            return await target(*args, **kwargs)

        return call


class World:
    """One store, ten planners, one worker that finishes what is due, one Operations."""

    def __init__(self, drivers: Sequence[Driver], clock: FakeClock, planners: int = 10) -> None:
        self.driver = drivers[0]
        self.clock = clock
        self.planners = [
            Planner(Yielding(drivers[i % len(drivers)]), clock=clock, batch=64) for i in range(planners)
        ]
        self.ops = Operations(self.driver, clock=clock)
        self._tokens = itertools.count()
        # a Mongo claim sends one command per attempt token: no more than can be due at once
        self.claim_batch = 1000 if isinstance(self.driver, MemoryDriver) else 2 * SIZES["mongomock"]

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def advance(self, delta: timedelta) -> None:
        self.clock.advance(delta)

    async def plan_pass(self) -> int:
        """Every planner runs one pass at once; returns the tasks created."""
        return sum(await asyncio.gather(*(p.run_once() for p in self.planners)))

    async def work(self, outcome: str = "succeeded") -> list[str]:
        """A worker claims every due task and ends it with ``outcome``; returns their keys."""
        attempts = [f"a{next(self._tokens)}" for _ in range(self.claim_batch)]
        claimed = await self.driver.claim(ClaimParams("w", ["job"], self.now, attempts))
        error = {"type": "RuntimeError", "message": "boom", "traceback": None}
        finishes = [
            FinishParams(
                c.key,
                "w",
                c.attempt,
                self.now,
                outcome,
                error=error if outcome == "failed" else None,
                retry_at=self.now if outcome == "failed" else None,
            )
            for c in claimed
        ]
        if finishes:
            assert all(await self.driver.finish(finishes))
        return [c.key for c in claimed]

    async def task_keys(self) -> list[str]:
        docs = await self.driver.list_tasks(ListParams(limit=100_000))
        return sorted(d["key"] for d in docs)

    async def keys_of(self, plan_id: str) -> list[str]:
        return [k for k in await self.task_keys() if k.startswith(f"plan:{plan_id}:")]

    async def add(self, plan_id: str, timing: PlanTiming, **plan: Any) -> None:
        plan.setdefault("option", NO_RETRY)
        await self.ops.add_plan(Plan(plan_id=plan_id, name="job", timing=timing, **plan))

    async def state(self, plan_id: str) -> PlanState:
        return (await self.ops.get_plan(plan_id)).state


@pytest.fixture
async def world(make_driver: DriverFactory, fake_clock: FakeClock) -> World:
    fake_clock.advance(START - fake_clock.now())
    drivers = [make_driver(fake_clock) for _ in range(10)]
    await drivers[0].setup()
    return World(drivers, fake_clock)


def kind_of(world: World) -> str:
    return "memory" if isinstance(world.driver, MemoryDriver) else "mongomock"


def hourly(offset: timedelta = HOUR, **timing: Any) -> PlanTiming:
    return PlanTiming(schedule=EverySchedule(interval=HOUR, start=START + offset), **timing)


async def run_for(world: World, span: timedelta, step: timedelta, each: Callable[[], Awaitable[Any]]) -> None:
    end = world.now + span
    while world.now < end:
        world.advance(step)
        await world.plan_pass()
        await each()


async def test_ten_planners_make_every_occurrence_exactly_once(world: World) -> None:
    """Mixed schedules over simulated days: the task keys are exactly the occurrences."""
    n, days = SIZES[kind_of(world)], DAYS[kind_of(world)]
    grace = timedelta(hours=1)  # passes every 15 minutes: nothing is late
    schedules = [
        lambda i: EverySchedule(interval=HOUR, start=START + timedelta(minutes=i % 60)),
        lambda i: EverySchedule(interval=timedelta(hours=6), start=START + timedelta(minutes=7 * i)),
        lambda i: CronSchedule(expression=f"{i % 60} */3 * * *"),
        lambda i: WeeklySchedule(weekdays=(i % 7, (i + 3) % 7)),
    ]
    timings = {}
    for i in range(n):
        timing = PlanTiming(schedule=schedules[i % 4](i), misfire_grace=grace, tz="Europe/Berlin")
        timings[f"p{i:03d}"] = timing
        await world.add(f"p{i:03d}", timing)
    created = world.now
    await run_for(world, timedelta(days=days), timedelta(minutes=15), world.work)
    expected = sorted(
        occurrence_key(plan_id, fire)
        for plan_id, timing in timings.items()
        for fire in itertools.takewhile(
            lambda t: t <= world.now, iter_occurrences(timing, created - timedelta(microseconds=1))
        )
    )
    keys = await world.task_keys()
    assert keys == expected
    assert len(keys) > 2 * n * days
    assert sum(p.materialised for p in world.planners) == len(keys)  # each inserted once
    assert sum(p.conflicts for p in world.planners) > 0  # they did race
    for info in await world.ops.list_plans(limit=1000):
        assert info.runs_made == len([k for k in keys if k.startswith(f"plan:{info.plan_id}:")])
        assert info.state is PlanState.ACTIVE and info.skipped_cnt == 0


@pytest.mark.parametrize("policy", list(CatchUp))
async def test_each_catch_up_policy_after_a_three_day_outage(world: World, policy: CatchUp) -> None:
    await world.add("p", hourly(catch_up=policy, catch_up_cap=10))
    await run_for(world, 3 * HOUR, timedelta(minutes=1), world.work)
    before = await world.keys_of("p")
    assert len(before) == 3
    world.advance(timedelta(days=3, minutes=30))  # nothing planned for 3 days
    await world.plan_pass()
    made = sorted(set(await world.keys_of("p")) - set(before))
    info = await world.ops.get_plan("p")
    last_hour = world.now.replace(minute=0, second=30)
    if policy is CatchUp.SKIP:
        assert made == []
        assert info.skipped_cnt == 72 and info.next_fire_time == last_hour + HOUR
    elif policy is CatchUp.RUN_ONCE:
        assert made == [occurrence_key("p", last_hour)]
        assert info.skipped_cnt == 71 and info.next_fire_time == last_hour + HOUR
    elif policy is CatchUp.RUN_ALL:
        # one run at a time (no overlap): the oldest kept occurrence now, the next ones as each
        # run ends (issue 17 B5)
        expected = [occurrence_key("p", last_hour - k * HOUR) for k in range(9, -1, -1)]
        assert made == expected[:1] and info.skipped_cnt == 62
        while len(made) < len(expected):
            assert await world.work() == made[-1:]  # the run ends: the next one is made
            world.advance(timedelta(seconds=10))
            await world.plan_pass()
            made = sorted(set(await world.keys_of("p")) - set(before))
        assert made == expected
        info = await world.ops.get_plan("p")
        assert info.skipped_cnt == 62
    else:  # after_completion: the stored occurrence runs late, the next counts from its end
        assert len(made) == 1 and info.state is PlanState.AWAITING_COMPLETION
        world.advance(timedelta(minutes=5))
        assert await world.work() == made
        ended = world.now
        world.advance(timedelta(seconds=5))
        await world.plan_pass()
        info = await world.ops.get_plan("p")
        assert info.state is PlanState.ACTIVE and info.next_fire_time == ended + HOUR
    assert info.runs_made == 3 + len(made)


async def test_suspend_resume_skip_and_end_conditions(world: World) -> None:
    await world.add("susp", hourly())
    await world.add("skip", hourly())
    await world.add("rep", hourly(repeat=2))
    await world.add("end", hourly(end=START + 3 * HOUR))
    await world.add("past_skip", PlanTiming(schedule=AtSchedule(at=START - HOUR)))
    await world.add("past_once", PlanTiming(schedule=AtSchedule(at=START - HOUR), catch_up=CatchUp.RUN_ONCE))
    await world.ops.suspend_plan("susp")
    await world.ops.skip_plan("skip", 2)
    await run_for(world, 5 * HOUR, timedelta(minutes=1), world.work)
    assert await world.keys_of("susp") == []
    assert await world.state("susp") is PlanState.SUSPENDED
    skip = await world.ops.get_plan("skip")
    assert (skip.runs_made, skip.skipped_cnt, skip.skip_next) == (3, 2, 0)
    assert await world.keys_of("skip") == [occurrence_key("skip", START + k * HOUR) for k in (3, 4, 5)]
    assert len(await world.keys_of("rep")) == 2 and await world.state("rep") is PlanState.ENDED
    assert len(await world.keys_of("end")) == 3 and await world.state("end") is PlanState.ENDED
    assert await world.keys_of("past_skip") == [] and await world.state("past_skip") is PlanState.ENDED
    assert await world.keys_of("past_once") == [occurrence_key("past_once", START - HOUR)]
    # resumed: the occurrences missed while suspended follow the policy (skip), then it runs
    await world.ops.resume_plan("susp")
    await run_for(world, 2 * HOUR, timedelta(minutes=1), world.work)
    susp = await world.ops.get_plan("susp")
    # resumed at 05:00:30: 01:00:30 .. 04:00:30 were late (skipped); 05:00, 06:00, 07:00 ran
    assert (susp.runs_made, susp.skipped_cnt, susp.state) == (3, 4, PlanState.ACTIVE)


async def test_runs_failing_three_times_in_a_row_park_the_plan_until_resumed(world: World) -> None:
    await world.add("p", hourly())
    await run_for(world, 3 * HOUR, timedelta(minutes=1), lambda: world.work("failed"))
    assert len(await world.keys_of("p")) == 3
    info = await world.ops.get_plan("p")
    assert info.last_run_status == "failed"
    world.advance(HOUR)
    await world.plan_pass()  # the 4th occurrence sees the 3rd failure: the streak is 3
    info = await world.ops.get_plan("p")
    assert (info.state, info.consecutive_failures, info.runs_made) == (PlanState.ERROR, 3, 3)
    await run_for(world, 3 * HOUR, timedelta(minutes=1), world.work)
    assert len(await world.keys_of("p")) == 3  # parked: nothing more
    assert [p.plan_id for p in await world.ops.list_plans(state="error")] == ["p"]
    info = await world.ops.resume_plan("p")
    assert (info.state, info.consecutive_failures) == (PlanState.ACTIVE, 0)
    await run_for(world, 2 * HOUR, timedelta(minutes=1), world.work)
    info = await world.ops.get_plan("p")
    # parked at 04:00:30, resumed at 07:00:30: 04:00 .. 06:00 skipped as late; 07:00 .. 09:00 ran
    assert (info.runs_made, info.skipped_cnt, info.consecutive_failures) == (6, 3, 0)
    assert info.last_run_status == "succeeded"


async def test_a_success_resets_the_failure_streak(world: World) -> None:
    await world.add("p", hourly(), max_consecutive_failures=2)
    outcomes = iter(["failed", "succeeded", "failed", "succeeded", "failed", "failed"])
    await run_for(world, 7 * HOUR, HOUR, lambda: world.work(next(outcomes, "succeeded")))
    info = await world.ops.get_plan("p")
    assert info.state is PlanState.ERROR and info.runs_made == 6


async def test_no_overlap_waits_for_the_previous_run_then_catches_up(world: World) -> None:
    await world.add("solo", hourly())
    await world.add("many", hourly(), allow_overlap=True)
    await run_for(world, 4 * HOUR, timedelta(minutes=1), lambda: asyncio.sleep(0))  # nobody works
    assert len(await world.keys_of("solo")) == 1  # the first run is still pending
    assert len(await world.keys_of("many")) == 4
    world.advance(timedelta(minutes=30))
    await world.work()
    await run_for(world, timedelta(minutes=1), timedelta(seconds=10), lambda: asyncio.sleep(0))
    solo = await world.ops.get_plan("solo")
    # the missed occurrences were late when the run ended: skipped (the default policy)
    assert (solo.runs_made, solo.skipped_cnt, solo.next_fire_time) == (1, 3, START + 5 * HOUR)
    world.advance(timedelta(minutes=30))
    await world.plan_pass()
    assert len(await world.keys_of("solo")) == 2


async def test_run_all_catch_up_never_overlaps_unless_allowed(world: World) -> None:
    """Issue 17 B5: ``run_all`` after an outage makes the missed occurrences one after another
    (each when the previous run ended) — never two pending or running at once — and all at once
    with ``allow_overlap=True``."""
    await world.add("solo", hourly(catch_up=CatchUp.RUN_ALL))
    await world.add("many", hourly(catch_up=CatchUp.RUN_ALL), allow_overlap=True)
    world.advance(4 * HOUR + timedelta(minutes=30))  # four occurrences missed, no planner ran
    await world.plan_pass()
    assert len(await world.keys_of("many")) == 4
    made: list[str] = []
    for _ in range(20):
        keys = await world.keys_of("solo")
        open_runs = [
            k for k in keys if (await world.driver.get_task(k) or {})["state"]["status"] == "pending"
        ]
        assert len(open_runs) <= 1, open_runs  # never two runs at once
        made = keys
        if len(keys) == 4 and not open_runs:
            break
        await world.work()  # the pending run (if any) runs and ends
        world.advance(timedelta(seconds=10))
        await world.plan_pass()
    assert made == [occurrence_key("solo", START + k * HOUR) for k in range(1, 5)]
    solo = await world.ops.get_plan("solo")
    assert solo.runs_made == 4 and solo.skipped_cnt == 0


async def test_planner_run_loops_on_the_clock_until_stopped(world: World) -> None:
    await world.add("p", hourly(offset=timedelta(seconds=30)))
    planner = Planner(world.driver, clock=world.clock, interval=10)
    runner = asyncio.create_task(planner.run())
    for _ in range(20):
        await asyncio.sleep(0)
    assert planner.passes == 1 and await world.keys_of("p") == []
    for _ in range(4):
        world.advance(timedelta(seconds=10))
        for _ in range(20):
            await asyncio.sleep(0)
    assert planner.passes == 5 and await world.keys_of("p") == [
        occurrence_key("p", START + timedelta(seconds=30))
    ]
    planner.stop()
    await asyncio.wait_for(runner, 1)
    planner.stop()  # idempotent
