"""Plan models: validation naming the field, the stored form, occurrence keys; Operations refusals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from mscheduler.domain.exceptions import InvalidInput, UnknownPlan
from mscheduler.domain.model import TaskOption
from mscheduler.domain.plans import Plan, PlanInfo, PlanState, occurrence_key, plan_state
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import PlanListParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.operations import Operations
from mscheduler.testing.clock import FakeClock

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def timing(**kw: Any) -> dict[str, Any]:
    return {"schedule": {"kind": "every", "interval": timedelta(hours=1), "start": NOW}} | kw


def test_a_plan_round_trips_through_its_stored_form() -> None:
    plan = Plan(
        plan_id="nightly",
        name="report",
        params={"x": [1, 2]},
        option=TaskOption(priority=2),
        timing=timing(tz="Europe/Berlin", repeat=5, catch_up="run_all"),
        allow_overlap=True,
    )
    doc = plan.to_storage(NOW - timedelta(minutes=1))
    assert doc["next_fire_time"] == NOW and doc["due_time"] == NOW and doc["state"] == "active"
    assert doc["timing"]["schedule"]["interval_ms"] == 3_600_000
    assert doc["timing"]["misfire_grace_ms"] == 60_000
    assert doc["task"]["option"]["run_at"] is None
    info = PlanInfo.from_storage(doc)
    assert info.as_plan() == plan
    assert (info.runs_made, info.consecutive_failures, info.state) == (0, 0, PlanState.ACTIVE)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"plan_id": ""}, "plan_id"),
        ({"plan_id": "a|b"}, "plan_id"),
        ({"plan_id": "x" * 201}, "plan_id"),
        ({"name": "bad name"}, "name"),
        ({"params": {"$set": 1}}, "params"),
        ({"max_consecutive_failures": 0}, "max_consecutive_failures"),
        ({"option": {"run_at": NOW}}, "option"),
        ({"timing": timing(repeat=0)}, "timing.repeat"),
        ({"timing": timing(tz="Mars/Base")}, "timing.tz"),
        ({"timing": timing(start=NOW, end=NOW - timedelta(1))}, "timing.end"),
        ({"timing": {"schedule": {"kind": "weekly", "weekdays": [7]}}}, "timing.schedule.weekly.weekdays"),
        ({"timing": {"schedule": {"kind": "monthly", "day": 32}}}, "timing.schedule.monthly.day"),
        ({"timing": {"schedule": {"kind": "cron", "expression": "61 * * * *"}}}, "timing.schedule.cron"),
        ({"timing": {"schedule": {"kind": "every", "interval": 0, "start": NOW}}}, "timing.schedule.every"),
    ],
)
def test_bad_input_is_refused_naming_the_field(data: dict[str, Any], field: str) -> None:
    good: dict[str, Any] = {"plan_id": "p", "name": "job", "timing": timing()}
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        Plan(**(good | data))


def test_occurrence_keys_are_deterministic_utc_milliseconds() -> None:
    berlin = datetime(2030, 6, 1, 9, 0, 0, 123456, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin"))
    assert occurrence_key("p", berlin) == "plan:p:2030-06-01T09:00:00.123Z"


def test_plan_state_precedence() -> None:
    assert plan_state(suspended=True, error=True, awaiting=False, next_fire_time=None) is PlanState.ENDED
    assert plan_state(suspended=True, error=True, awaiting=False, next_fire_time=NOW) is PlanState.ERROR
    assert plan_state(suspended=True, error=False, awaiting=True, next_fire_time=None) is PlanState.SUSPENDED
    assert plan_state(suspended=False, error=False, awaiting=True, next_fire_time=None) is (
        PlanState.AWAITING_COMPLETION
    )


async def test_operations_refuse_bad_input_and_unknown_plans_writing_nothing() -> None:
    clock = FakeClock(NOW)
    driver = MemoryDriver(clock=clock)
    ops = Operations(driver, clock=clock)
    plan = Plan(plan_id="p", name="job", timing=PlanTiming(schedule=EverySchedule(interval=60, start=NOW)))
    info = await ops.add_plan(plan)
    assert info.state is PlanState.ACTIVE
    with pytest.raises(InvalidInput, match="plan_id"):
        await ops.add_plan(plan)
    with pytest.raises(InvalidInput, match=r"timing\.schedule\.weekly\.weekdays"):
        await ops.edit_plan("p", timing={"schedule": {"kind": "weekly", "weekdays": [7]}})
    with pytest.raises(InvalidInput, match="suspended"):
        await ops.edit_plan("p", suspended=True)
    with pytest.raises(InvalidInput, match="n:"):
        await ops.skip_plan("p", -1)
    with pytest.raises(InvalidInput, match="state"):
        await ops.list_plans(state="sleeping")
    assert (await ops.get_plan("p")).version == 1  # nothing written
    for call in (ops.get_plan, ops.suspend_plan, ops.resume_plan, ops.remove_plan):
        with pytest.raises(UnknownPlan):
            await call("nope")
    edited = await ops.edit_plan("p", params={"v": 2}, timing=timing(start=NOW + timedelta(days=1)))
    assert edited.params == {"v": 2} and edited.next_fire_time == NOW + timedelta(days=1)
    assert (await ops.suspend_plan("p")).state is PlanState.SUSPENDED
    assert (await ops.resume_plan("p")).state is PlanState.ACTIVE
    assert (await ops.skip_plan("p", 3)).skip_next == 3
    await ops.remove_plan("p")
    assert await driver.list_plans(PlanListParams()) == []


def test_the_example_in_docs_plans_md_runs() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "plans.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(example, "docs/plans.md", "exec"), {"__name__": "docs_example"})
