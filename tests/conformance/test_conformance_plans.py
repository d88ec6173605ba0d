"""Plan operations (insert, get, list, update, delete, find_due, advance, run outcomes): every driver."""

from __future__ import annotations

from datetime import time, timedelta
from typing import Any

import pytest

from mscheduler.domain.model import TaskOption
from mscheduler.domain.plans import Plan, PlanInfo, PlanState
from mscheduler.domain.schedule import (
    AtSchedule,
    CatchUp,
    CronSchedule,
    EverySchedule,
    MonthlySchedule,
    PlanTiming,
    WeeklySchedule,
)
from mscheduler.drivers.base import (
    AdvancePlansParams,
    DuePlansParams,
    InsertPlanParams,
    PlanAdvance,
    PlanListParams,
    UpdatePlanParams,
)
from tests.conformance.support import Store, naive_datetimes


def every_minute(store: Store, plan_id: str, *, offset: float = 60, **plan: Any) -> dict[str, Any]:
    """A plan document whose first fire time is ``offset`` seconds from now."""
    timing = PlanTiming(schedule=EverySchedule(interval=timedelta(minutes=1), start=store.at(offset)))
    return Plan(plan_id=plan_id, name="job", params={"p": plan_id}, timing=timing, **plan).to_storage(
        store.now
    )


async def insert(store: Store, doc: dict[str, Any]) -> bool:
    return await store.driver.insert_plan(InsertPlanParams(doc, store.now))


async def due_ids(store: Store, limit: int = 100) -> list[str]:
    return [d["plan_id"] for d in await store.driver.find_due_plans(DuePlansParams(store.now, limit))]


async def test_a_plan_reads_back_as_written_with_aware_utc_times(store: Store) -> None:
    timings = [
        PlanTiming(schedule=AtSchedule(at=store.at(10)), catch_up=CatchUp.RUN_ONCE),
        PlanTiming(schedule=EverySchedule(interval=timedelta(hours=6), start=store.at(1)), repeat=3),
        PlanTiming(schedule=WeeklySchedule(weekdays=(0, 4), local_time=time(9, 30)), tz="Europe/Berlin"),
        PlanTiming(schedule=MonthlySchedule(day=-1), end=store.at(86400 * 400), catch_up=CatchUp.RUN_ALL),
        PlanTiming(schedule=CronSchedule(expression="0 */2 * * 1-5"), misfire_grace=timedelta(seconds=5)),
    ]
    option = TaskOption(priority=3, retry_delay=timedelta(seconds=7))
    for i, timing in enumerate(timings):
        plan = Plan(plan_id=f"p{i}", name="job", params={"i": i}, option=option, timing=timing)
        doc = plan.to_storage(store.now)
        assert await insert(store, doc) is True
        got = await store.driver.get_plan(f"p{i}")
        assert got == doc
        assert naive_datetimes(got) == []
        info = PlanInfo.from_storage(got)
        assert info.as_plan() == plan
        assert info.state is PlanState.ACTIVE
    assert await store.driver.get_plan("nope") is None


async def test_a_second_insert_of_an_id_is_refused_and_changes_nothing(store: Store) -> None:
    first = every_minute(store, "a")
    assert await insert(store, first) is True
    store.advance(5)
    assert await insert(store, every_minute(store, "a", allow_overlap=True)) is False
    assert await store.driver.get_plan("a") == first


async def test_list_plans_in_creation_order_by_state_with_paging(store: Store) -> None:
    for i in range(5):
        await insert(store, every_minute(store, f"p{i}", suspended=i % 2 == 1))
        store.advance(1)
    listed = await store.driver.list_plans(PlanListParams())
    assert [d["plan_id"] for d in listed] == ["p0", "p1", "p2", "p3", "p4"]
    page = await store.driver.list_plans(PlanListParams(limit=2, skip=1))
    assert [d["plan_id"] for d in page] == ["p1", "p2"]
    suspended = await store.driver.list_plans(PlanListParams(state="suspended"))
    assert [d["plan_id"] for d in suspended] == ["p1", "p3"]
    active = await store.driver.list_plans(PlanListParams(state="active", limit=1, skip=1))
    assert [d["plan_id"] for d in active] == ["p2"]


async def test_update_plan_is_a_compare_and_set_on_the_version(store: Store) -> None:
    await insert(store, every_minute(store, "a"))
    store.advance(1)
    fields = {"suspended": True, "state": "suspended", "due_time": None, "version": 2}
    assert await store.driver.update_plan(UpdatePlanParams("a", 1, fields, store.now)) is True
    got = await store.driver.get_plan("a")
    assert got is not None
    assert (got["state"], got["version"], got["update_time"]) == ("suspended", 2, store.now)
    stale = {"suspended": False, "version": 2}
    assert await store.driver.update_plan(UpdatePlanParams("a", 1, stale, store.now)) is False
    assert await store.driver.update_plan(UpdatePlanParams("zz", 1, stale, store.now)) is False
    assert (await store.driver.get_plan("a")) == got


async def test_delete_plan(store: Store) -> None:
    await insert(store, every_minute(store, "a"))
    assert await store.driver.delete_plan("a") is True
    assert await store.driver.delete_plan("a") is False
    assert await store.driver.get_plan("a") is None
    assert await due_ids(store) == []


async def test_find_due_plans_returns_due_planner_states_earliest_first(store: Store) -> None:
    await insert(store, every_minute(store, "late", offset=30))
    await insert(store, every_minute(store, "early", offset=10))
    await insert(store, every_minute(store, "future", offset=3600))
    await insert(store, every_minute(store, "held", offset=5, suspended=True))
    assert await due_ids(store) == []
    store.advance(60)
    assert await due_ids(store) == ["early", "late"]
    assert await due_ids(store, limit=1) == ["early"]
    # a plan awaiting completion is read when its due time comes, like an active one
    fields = {"state": "awaiting_completion", "awaiting": True, "due_time": store.at(-55), "version": 2}
    assert await store.driver.update_plan(UpdatePlanParams("late", 1, fields, store.now))
    assert await due_ids(store) == ["late", "early"]
    # moving a plan's due time past now (or ending it) takes it out
    later = {"due_time": store.at(30), "version": 3}
    assert await store.driver.update_plan(UpdatePlanParams("late", 2, later, store.now))
    ended = {"state": "ended", "due_time": None, "next_fire_time": None, "version": 2}
    assert await store.driver.update_plan(UpdatePlanParams("early", 1, ended, store.now))
    assert await due_ids(store) == []
    store.advance(30)
    assert await due_ids(store) == ["late"]


async def test_advance_plans_applies_only_matching_compare_and_sets(store: Store) -> None:
    for plan_id in ("a", "b", "c"):
        await insert(store, every_minute(store, plan_id, offset=10))
    store.advance(20)
    docs = {d["plan_id"]: d for d in await store.driver.find_due_plans(DuePlansParams(store.now, 10))}
    assert sorted(docs) == ["a", "b", "c"]
    # "b" is changed by someone else first: its compare-and-set must fail
    assert await store.driver.update_plan(UpdatePlanParams("b", 1, {"skip_next": 1, "version": 2}, store.now))

    def advance(doc: dict[str, Any], **fields: Any) -> PlanAdvance:
        return PlanAdvance(doc["plan_id"], doc["version"], doc["next_fire_time"], fields)

    new_fire = store.at(40)
    ops = [
        advance(docs[p], next_fire_time=new_fire, due_time=new_fire, runs_made=1, version=2) for p in "abc"
    ]
    # a wrong next_fire_time fails as a wrong version does
    ops[2] = PlanAdvance("c", 1, store.at(-999), {"runs_made": 7, "version": 2})
    assert await store.driver.advance_plans(AdvancePlansParams(ops, store.now)) == 1
    a, b, c = [await store.driver.get_plan(p) for p in "abc"]
    assert a is not None and b is not None and c is not None
    assert (a["next_fire_time"], a["runs_made"], a["version"], a["update_time"]) == (
        new_fire,
        1,
        2,
        store.now,
    )
    assert (b["runs_made"], b["skip_next"], b["version"]) == (0, 1, 2)
    assert (c["runs_made"], c["version"]) == (0, 1)
    assert sorted(await due_ids(store)) == ["b", "c"]  # same due time: any order
    # the same advances again change nothing (the version moved on)
    assert await store.driver.advance_plans(AdvancePlansParams(ops, store.now)) == 0
    assert await store.driver.advance_plans(AdvancePlansParams([], store.now)) == 0


@pytest.mark.global_claim_order
async def test_run_outcomes_give_status_and_last_end_time(store: Store) -> None:
    await store.add("ok")
    await store.add("bad", max_unexpected_retries=0)
    await store.add("waiting")
    claimed = {c.key: c for c in await store.claim("w1", 2)}
    store.advance(3)
    await store.done(claimed["ok"], "w1")
    ended = store.now
    await store.fail(claimed["bad"], "w1")
    outcomes = await store.driver.get_run_outcomes(["ok", "bad", "waiting", "gone"])
    assert sorted(outcomes) == ["bad", "ok", "waiting"]
    assert (outcomes["ok"].status, outcomes["ok"].end_time) == ("succeeded", ended)
    assert (outcomes["bad"].status, outcomes["bad"].end_time) == ("failed", ended)
    assert (outcomes["waiting"].status, outcomes["waiting"].end_time) == ("pending", None)
    assert await store.driver.get_run_outcomes([]) == {}
