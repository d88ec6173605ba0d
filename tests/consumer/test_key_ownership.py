"""Keys the scheduler makes itself belong to their makers, on every driver: no send creates a
plan's run key or a child's key, a planner does not take a task it did not make for its run, a
parent does not adopt a child key it did not make, and a reset keeps the attempts it ends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mscheduler import InvalidInput, Operations, Task
from mscheduler.domain.plans import Plan, occurrence_key
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import ClaimParams, FinishParams, InsertParams, NewTask
from mscheduler.services.planner import Planner
from tests.conformance.support import stored_option
from tests.consumer.support import Harness


@pytest.mark.parametrize(
    "key",
    ["plan:nightly:2030-01-01T01:00:00.000Z", "plan:anything", "etl/fetch", "a/b/c"],
)
async def test_no_send_creates_a_key_the_scheduler_makes(harness: Harness, key: str) -> None:
    operations = Operations(harness.driver, clock=harness.clock)
    for send in (harness.publisher.send, operations.send):
        with pytest.raises(InvalidInput, match="cannot be sent"):
            await send(Task(key, "job"))
    with pytest.raises(InvalidInput, match="cannot be sent"):
        await harness.publisher.send_many([Task("fine", "job"), Task(key, "job")])
    assert await harness.driver.get_tasks(["fine", key]) == []  # nothing written


async def squat(harness: Harness, key: str, name: str = "other") -> None:
    """A task at ``key`` that its maker did not make (a store written by hand, or before the
    rule): inserted below the rules, as no send can."""
    task = NewTask(key, name, {"mine": True}, stored_option(harness.clock.now()))
    assert await harness.driver.insert_tasks(InsertParams([task], harness.clock.now())) == [True]


async def test_a_planner_does_not_take_a_task_it_did_not_make_for_its_run(harness: Harness) -> None:
    operations = Operations(harness.driver, clock=harness.clock)
    start = harness.clock.now() + timedelta(minutes=1)
    timing = PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=start))
    await operations.add_plan(Plan(plan_id="nightly", name="report", timing=timing))
    key = occurrence_key("nightly", start)
    await squat(harness, key)
    harness.clock.advance(61)
    planner = Planner(harness.driver, clock=harness.clock, recheck=1)
    assert await planner.run_once() == 0  # the key was taken: nothing made
    now = harness.clock.now()
    [claimed] = await harness.driver.claim(ClaimParams("w1", ["other"], now, ["t1"]))
    finish = FinishParams(key, "w1", claimed.attempt, now, "succeeded", None, None, None, True)
    assert await harness.driver.finish([finish]) == [True]  # the squatter's own handler ran
    plan = await operations.get_plan("nightly")
    assert plan.last_run_key == key
    assert plan.last_run_status == "taken"  # not "succeeded": that run was not the plan's
    harness.clock.advance(3600)  # the next fire: the planner looks at its last run again
    assert await planner.run_once() == 0
    plan = await operations.get_plan("nightly")
    assert plan.last_run_status == "taken"
    assert plan.state.value == "error"  # parked, saying so, until an operator resumes it
    assert plan.runs_made == 1 and plan.consecutive_failures == 0


async def test_a_plan_s_own_runs_are_taken_for_its_runs(harness: Harness) -> None:
    operations = Operations(harness.driver, clock=harness.clock)
    start = harness.clock.now() + timedelta(minutes=1)
    timing = PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=start))
    await operations.add_plan(Plan(plan_id="nightly", name="report", timing=timing))
    harness.clock.advance(61)
    planners = [Planner(harness.new_driver(), clock=harness.clock, recheck=1) for _ in range(2)]
    assert sum([await p.run_once() for p in planners]) == 1  # two planners, one run
    now = harness.clock.now()
    [claimed] = await harness.driver.claim(ClaimParams("w1", ["report"], now, ["t1"]))
    key = occurrence_key("nightly", start)
    finish = FinishParams(key, "w1", claimed.attempt, now, "succeeded", None, None, None, True)
    assert await harness.driver.finish([finish]) == [True]
    harness.clock.advance(3600)
    assert await planners[1].run_once() == 1  # the next run
    plan = await operations.get_plan("nightly")
    assert (plan.state.value, plan.runs_made) == ("active", 2)


async def test_a_parent_does_not_adopt_a_child_key_it_did_not_make(harness: Harness) -> None:
    from mscheduler.domain.exceptions import KeyTaken

    await squat(harness, "etl/fetch")
    with pytest.raises(KeyTaken, match="'etl/fetch' is taken by a task that parent 'etl' did not make"):
        await harness.publisher.send(Task("etl", "etl", children=["fetch", "load"]))
    assert await harness.driver.get_tasks(["etl", "etl/load"]) == []  # nothing written
    taken = await harness.driver.get_task("etl/fetch")
    assert taken is not None and taken.get("parent") is None and taken["name"] == "other"
    # its own children are its own: sending the family again is idempotent
    assert await harness.publisher.send(Task("etl2", "etl", children=["fetch", "load"])) is True
    assert await harness.publisher.send(Task("etl2", "etl", children=["fetch", "load"])) is False
