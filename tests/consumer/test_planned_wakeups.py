"""A plan paced from the end of each run ("after completion") starts each run on time on a store
without change streams too: the consumer whose planner created the run queues its due time
itself, as it does for a retry (on 4dad86a, mongomock, the run waited for the next poll: 90 s
late with a 90 s poll interval; on time on the memory driver, whose stream announced it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest

from mscheduler import App, CatchUp, EverySchedule, FakeClock, Plan, PlanTiming, TaskContext
from mscheduler.testing.kit import scheduler_kit

START = datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
EVERY = timedelta(minutes=2)


@pytest.mark.parametrize("store", ["memory", "mongomock"])
async def test_an_after_completion_plan_runs_on_time_without_waiting_for_a_poll(
    store: Literal["memory", "mongomock"],
) -> None:
    app = App("paced")
    starts: list[tuple[str, datetime]] = []
    timing = PlanTiming(
        schedule=EverySchedule(interval=EVERY, start=START), catch_up=CatchUp.AFTER_COMPLETION
    )
    app.plan(Plan(plan_id="p", name="job", timing=timing))
    clock = FakeClock(START - timedelta(seconds=30))

    @app.handler("job")
    async def job(params: object, ctx: TaskContext) -> None:
        starts.append((ctx.key, clock.now()))

    kit = scheduler_kit(app, store=store, clock=clock, poll_interval=90.0, stream_poll_interval=90.0)
    async with kit:
        for _ in range(int(timedelta(minutes=9) / timedelta(seconds=1))):
            await kit.advance(1.0)
    assert len(starts) >= 4, starts
    previous_end = None
    for key, started in starts:
        due = datetime.fromisoformat(key.split(":", 2)[2].replace("Z", "+00:00"))
        assert started - due <= timedelta(seconds=1), f"{key} started {started - due} late"
        if previous_end is not None:  # paced from the end of the previous run
            assert due - previous_end <= EVERY + timedelta(seconds=1)
        previous_end = started
