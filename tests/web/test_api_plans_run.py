"""Plans for the dashboard (issue 20, item 5): the next five fire times from the schedule's
arithmetic (``upcoming``), the last runs listed by key (newest first), and run-now: one run outside
the schedule, refused while a run of a plan without overlap is live."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from mscheduler import Operations
from mscheduler.domain.plans import Plan, upcoming_fire_times
from mscheduler.domain.schedule import CatchUp, CronSchedule, EverySchedule, PlanTiming
from tests.web.support import ADMIN, READ, CountingDriver

PLANS = "/api/v1/plans"
START = "2030-01-01T00:00:00Z"


async def test_a_plan_lists_its_next_five_fire_times(client: httpx.AsyncClient) -> None:
    body = {
        "plan_id": "hourly",
        "name": "report",
        "timing": {"schedule": {"kind": "every", "interval": 3600, "start": START}},
    }
    assert (await client.post(PLANS, json=body, headers=ADMIN)).status_code == 201
    plan = (await client.get(f"{PLANS}/hourly", headers=READ)).json()
    assert plan["upcoming"] == [f"2030-01-01T0{h}:00:00Z" for h in range(5)]
    assert [p["upcoming"][:2] for p in (await client.get(PLANS, headers=READ)).json()] == [
        plan["upcoming"][:2]
    ]


def test_the_upcoming_times_follow_the_schedule_its_end_and_its_repeat() -> None:
    start = datetime(2030, 1, 6, tzinfo=UTC)  # a Sunday
    cron = PlanTiming(schedule=CronSchedule(expression="0 9 * * 1-5"), tz="Europe/Paris")
    times = upcoming_fire_times(cron, cron.next_occurrence(start), 0)
    assert [t.isoformat() for t in times] == [f"2030-01-{d:02}T08:00:00+00:00" for d in (7, 8, 9, 10, 11)]
    every = PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=start), repeat=3)
    assert len(upcoming_fire_times(every, start, 1)) == 2  # two runs left
    assert upcoming_fire_times(every, None, 0) == []  # ended
    after = PlanTiming(
        schedule=EverySchedule(interval=timedelta(hours=1), start=start), catch_up=CatchUp.AFTER_COMPLETION
    )
    assert upcoming_fire_times(after, start, 0) == [start]  # the rest counts from when runs end


async def test_run_now_makes_one_run_outside_the_schedule(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    ops = Operations(driver, clock=driver.clock)
    timing = PlanTiming(
        schedule=EverySchedule(interval=timedelta(hours=1), start=datetime(2031, 1, 1, tzinfo=UTC))
    )
    await ops.add_plan(Plan(plan_id="sync", name="sync_account", params={"n": 1}, timing=timing))
    before = await ops.get_plan("sync")
    run = await client.post(f"{PLANS}/sync/run", headers=ADMIN)
    assert run.status_code == 201, run.text
    task = run.json()
    assert (
        task["key"].startswith("plan:sync:") and task["name"] == "sync_account" and task["params"] == {"n": 1}
    )
    after = await ops.get_plan("sync")
    assert (after.next_fire_time, after.runs_made, after.last_run_key) == (
        before.next_fire_time,
        before.runs_made,
        before.last_run_key,
    )
    runs = (
        await client.get("/api/v1/tasks", params={"key_prefix": "plan:sync:", "sort": "-key"}, headers=READ)
    ).json()
    assert [t["key"] for t in runs["tasks"]] == [task["key"]]
    assert (await client.post(f"{PLANS}/nope/run", headers=ADMIN)).status_code == 404
    assert (await client.post(f"{PLANS}/sync/run", headers=READ)).status_code == 403


async def test_run_now_is_refused_while_a_run_without_overlap_is_live(driver: CountingDriver) -> None:
    ops = Operations(driver, clock=driver.clock)
    start = driver.clock.now()
    timing = PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=start))
    await ops.add_plan(Plan(plan_id="nightly", name="report", timing=timing))
    from mscheduler.services.planner import Planner

    assert await Planner(driver, clock=driver.clock).run_once() == 1  # its first run is pending
    from mscheduler.domain.exceptions import TransitionRefused

    try:
        await ops.run_plan_now("nightly")
    except TransitionRefused as exc:
        assert exc.status == "pending" and "does not allow overlap" in exc.rule
    else:
        raise AssertionError("run-now beside a live run of a plan without overlap")
