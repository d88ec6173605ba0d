"""The planner's pure step: catch-up policies after an outage, skip counters, end conditions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.schedule import (
    AtSchedule,
    CatchUp,
    CronSchedule,
    EverySchedule,
    PlanProgress,
    PlanStep,
    PlanTiming,
    Schedule,
    WeeklySchedule,
    first_fire_time,
    iter_occurrences,
    next_after,
    next_fire_after_completion,
    plan_step,
)

T0 = datetime(2030, 1, 7, tzinfo=UTC)  # a Monday
H = timedelta(hours=1)
S = timedelta(seconds=1)
HOURLY = EverySchedule(interval=H, start=T0)
OUTAGE_END = T0 + timedelta(days=3, minutes=10)  # the planner last ran at T0 and materialised T0
BERLIN = ZoneInfo("Europe/Berlin")


def timing(**kwargs: Any) -> PlanTiming:
    kwargs.setdefault("schedule", HOURLY)
    return PlanTiming(**kwargs)


def progress(next_fire_time: datetime | None, runs_made: int = 0, skip_next: int = 0) -> PlanProgress:
    return PlanProgress(next_fire_time=next_fire_time, runs_made=runs_made, skip_next=skip_next)


def advance(plan: PlanTiming, state: PlanProgress, step: PlanStep) -> PlanProgress:
    """What the caller stores after materialising the step (its compare-and-set succeeded)."""
    return PlanProgress(
        next_fire_time=step.next_fire_time, runs_made=step.runs_made, skip_next=step.skip_next
    )


def run_until(
    plan: PlanTiming, state: PlanProgress, now: datetime
) -> tuple[list[datetime], int, PlanProgress, PlanStep]:
    """Step until nothing more is due at ``now`` (as a planner loop would)."""
    fires: list[datetime] = []
    skipped = 0
    while True:
        step = plan_step(plan, state, now)
        fires += step.fire_times
        skipped += step.skipped_cnt
        state = advance(plan, state, step)
        if not step.more_due:
            return fires, skipped, state, step


# -- each catch-up policy after a 3-day outage ----------------------------------------------------


def test_skip_runs_nothing_that_was_missed_and_resumes() -> None:
    step = plan_step(timing(), progress(T0 + H, runs_made=1), OUTAGE_END)
    assert step.fire_times == ()
    assert step.skipped_cnt == 72  # T0+1h .. T0+72h
    assert step.next_fire_time == T0 + 73 * H
    assert (step.runs_made, step.ended, step.more_due) == (1, False, False)


def test_skip_runs_an_occurrence_still_within_the_grace() -> None:
    now = T0 + 72 * H + 30 * S
    step = plan_step(timing(), progress(T0 + H), now)
    assert step.fire_times == (T0 + 72 * H,) and step.skipped_cnt == 71


def test_run_once_runs_the_latest_missed_once() -> None:
    step = plan_step(timing(catch_up=CatchUp.RUN_ONCE), progress(T0 + H, runs_made=1), OUTAGE_END)
    assert step.fire_times == (T0 + 72 * H,)
    assert step.skipped_cnt == 71 and step.runs_made == 2
    assert step.next_fire_time == T0 + 73 * H


def test_run_all_runs_every_missed_occurrence_up_to_the_cap() -> None:
    step = plan_step(timing(catch_up=CatchUp.RUN_ALL), progress(T0 + H), OUTAGE_END)
    assert step.fire_times == tuple(T0 + k * H for k in range(1, 73))
    assert step.skipped_cnt == 0 and step.next_fire_time == T0 + 73 * H
    capped = plan_step(timing(catch_up=CatchUp.RUN_ALL, catch_up_cap=10), progress(T0 + H), OUTAGE_END)
    assert capped.fire_times == tuple(T0 + k * H for k in range(63, 73))  # the 10 most recent
    assert capped.skipped_cnt == 62


def test_after_completion_runs_once_late_then_counts_from_the_runs_end() -> None:
    plan = timing(catch_up=CatchUp.AFTER_COMPLETION)
    step = plan_step(plan, progress(T0 + H, runs_made=1), OUTAGE_END)
    assert step.fire_times == (T0 + H,)
    assert step.next_fire_time is None and step.awaiting_completion and not step.ended
    run_end = OUTAGE_END + timedelta(minutes=5, milliseconds=1, microseconds=999)
    assert next_fire_after_completion(plan, step.runs_made, run_end) == run_end.replace(microsecond=1000) + H
    # While awaiting, a step has nothing to do (the stored next_fire_time is None).
    assert plan_step(plan, advance(plan, progress(T0 + H), step), OUTAGE_END).fire_times == ()


def test_a_daily_local_plan_after_an_outage_across_a_dst_change() -> None:
    daily = CronSchedule(expression="0 9 * * *")
    plan = timing(schedule=daily, tz="Europe/Berlin", catch_up=CatchUp.RUN_ALL)
    first = datetime(2030, 3, 29, 9, tzinfo=BERLIN)
    step = plan_step(plan, progress(first), datetime(2030, 4, 1, 12, tzinfo=BERLIN))
    assert [t.astimezone(BERLIN).isoformat() for t in step.fire_times] == [
        "2030-03-29T09:00:00+01:00",
        "2030-03-30T09:00:00+01:00",
        "2030-03-31T09:00:00+02:00",
        "2030-04-01T09:00:00+02:00",
    ]


def test_after_completion_every_day_keeps_the_local_time_of_the_runs_end() -> None:
    plan = timing(schedule=EverySchedule(interval=timedelta(days=1), start=T0), tz="Europe/Berlin")
    plan = plan.model_copy(update={"catch_up": CatchUp.AFTER_COMPLETION})
    run_end = datetime(2030, 3, 30, 9, 15, tzinfo=BERLIN)
    assert next_fire_after_completion(plan, 1, run_end) == datetime(2030, 3, 31, 9, 15, tzinfo=BERLIN)
    weekly = timing(schedule=WeeklySchedule(weekdays=(0,)), catch_up=CatchUp.AFTER_COMPLETION)
    assert next_fire_after_completion(weekly, 1, T0 + H) == T0 + timedelta(days=7)


# -- one-off plans --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("catch_up", "runs"),
    [
        (CatchUp.SKIP, False),
        (CatchUp.RUN_ONCE, True),
        (CatchUp.RUN_ALL, True),
        (CatchUp.AFTER_COMPLETION, True),
    ],
)
def test_a_past_one_off_runs_only_under_a_catch_up_policy(catch_up: CatchUp, runs: bool) -> None:
    at = T0 - timedelta(days=1)
    plan = timing(schedule=AtSchedule(at=at), catch_up=catch_up)
    nft = first_fire_time(plan, T0)
    assert nft == at
    step = plan_step(plan, progress(nft), T0)
    assert step.fire_times == ((at,) if runs else ())
    assert step.ended and step.next_fire_time is None and not step.awaiting_completion


def test_a_one_off_runs_when_due_and_then_ends() -> None:
    plan = timing(schedule=AtSchedule(at=T0))
    assert plan_step(plan, progress(T0), T0 - S).fire_times == ()
    step = plan_step(plan, progress(T0), T0 + 2 * S)
    assert step.fire_times == (T0,) and step.ended and step.runs_made == 1


# -- skip-next counters ---------------------------------------------------------------------------


def test_skip_next_consumes_the_next_occurrences() -> None:
    plan = timing()
    state = progress(T0, skip_next=2)
    seen = []
    for k in range(4):
        step = plan_step(plan, state, T0 + k * H + S)
        seen.append((step.fire_times, step.skipped_cnt, step.skip_next))
        state = advance(plan, state, step)
    assert seen == [((), 1, 1), ((), 1, 0), ((T0 + 2 * H,), 0, 0), ((T0 + 3 * H,), 0, 0)]
    assert state.runs_made == 2


def test_skip_next_consumes_missed_occurrences_first() -> None:
    step = plan_step(timing(catch_up=CatchUp.RUN_ALL), progress(T0 + H, skip_next=5), OUTAGE_END)
    assert step.fire_times == tuple(T0 + k * H for k in range(6, 73))
    assert (step.skipped_cnt, step.skip_next) == (5, 0)


def test_skip_next_under_after_completion_moves_on_from_the_skipped_time() -> None:
    plan = timing(catch_up=CatchUp.AFTER_COMPLETION)
    step = plan_step(plan, progress(T0, skip_next=2), T0 + 2 * H + S)
    assert step.fire_times == (T0 + 2 * H,) and step.skipped_cnt == 2 and step.skip_next == 0


# -- end conditions -------------------------------------------------------------------------------


def test_repeat_ends_the_plan_after_that_many_runs() -> None:
    plan = timing(repeat=3)
    state = progress(first_fire_time(plan, T0))
    fires: list[datetime] = []
    for k in range(6):
        step = plan_step(plan, state, T0 + k * H + S)
        fires += step.fire_times
        state = advance(plan, state, step)
    assert fires == [T0, T0 + H, T0 + 2 * H]
    assert state.next_fire_time is None and state.runs_made == 3


def test_repeat_bounds_a_run_all_catch_up() -> None:
    step = plan_step(timing(catch_up=CatchUp.RUN_ALL, repeat=5), progress(T0 + H, runs_made=2), OUTAGE_END)
    assert step.fire_times == (T0 + H, T0 + 2 * H, T0 + 3 * H)
    assert step.ended and step.runs_made == 5


def test_end_is_inclusive_and_ends_the_plan() -> None:
    plan = timing(end=T0 + 2 * H)
    step = plan_step(plan, progress(T0), T0 + 2 * H + S)
    assert step.fire_times == (T0 + 2 * H,) and step.skipped_cnt == 2
    assert step.ended and step.next_fire_time is None


def test_a_plan_whose_last_occurrence_is_past_ends_without_running() -> None:
    step = plan_step(timing(end=T0 + 10 * H), progress(T0 + H), OUTAGE_END)
    assert step.fire_times == () and step.skipped_cnt == 10 and step.ended


def test_an_ended_or_finished_plan_stays_ended_and_a_future_one_waits() -> None:
    assert plan_step(timing(), progress(None), T0).ended
    assert plan_step(timing(repeat=2), progress(T0, runs_made=2), T0 + H).ended
    waiting = plan_step(timing(), progress(T0 + H), T0)
    assert waiting.fire_times == () and waiting.next_fire_time == T0 + H and not waiting.ended


def test_first_fire_time_honours_start_end_and_creation_time() -> None:
    now = T0 + 90 * timedelta(minutes=1)
    assert first_fire_time(timing(), now) == T0 + 2 * H  # a recurring plan begins at creation
    assert first_fire_time(timing(start=T0 + 5 * H), now) == T0 + 5 * H  # or at its start
    assert first_fire_time(timing(start=T0 - 5 * H), now) == T0  # an every schedule starts at its start
    assert first_fire_time(timing(start=T0 + 30 * S), now) == T0 + H
    assert first_fire_time(timing(start=T0 + S, end=T0 + 2 * S), now) is None
    assert list(iter_occurrences(timing(end=T0 + 3 * H), T0)) == [T0 + H, T0 + 2 * H, T0 + 3 * H]


# -- long outages are stepped in bounded chunks ---------------------------------------------------


def test_a_huge_backlog_is_scanned_in_chunks_with_exact_counts() -> None:
    every_second = EverySchedule(interval=S, start=T0)
    now = T0 + timedelta(hours=6)
    plan = timing(schedule=every_second)
    step = plan_step(plan, progress(T0), now, scan_limit=5_000)
    assert step.more_due and step.fire_times == () and step.skipped_cnt == 5_000
    fires, skipped, state, last = run_until(plan, progress(T0), now)
    on_time = 61  # now - 60 s .. now, both ends included
    assert len(fires) == on_time and fires[0] == now - timedelta(seconds=60)
    assert skipped == 6 * 3600 + 1 - on_time
    assert state.next_fire_time == now + S and not last.more_due

    capped = timing(schedule=every_second, catch_up=CatchUp.RUN_ALL, catch_up_cap=5)
    fires, skipped, state, _ = run_until(capped, progress(T0), now)
    late_kept = [now - timedelta(seconds=60 + k) for k in range(5, 0, -1)]
    assert fires == late_kept + [now - timedelta(seconds=60 - k) for k in range(61)]
    assert skipped == 6 * 3600 + 1 - 61 - 5


# -- a simulated timeline: whatever the planner's call times, no occurrence runs twice -----------

SCHEDULES: list[Schedule] = [
    HOURLY,
    EverySchedule(interval=timedelta(minutes=25), start=T0 + 7 * S),
    CronSchedule(expression="*/20 * * * *"),
    CronSchedule(expression="30 2 * * *"),
    WeeklySchedule(weekdays=(0, 3, 6)),
]


@settings(max_examples=100, deadline=None)
@given(
    schedule=st.sampled_from(SCHEDULES),
    tz=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
    catch_up=st.sampled_from([CatchUp.SKIP, CatchUp.RUN_ONCE, CatchUp.RUN_ALL]),
    gaps=st.lists(st.integers(1, 3 * 86_400), min_size=1, max_size=30),
    start=st.datetimes(datetime(2030, 1, 1), datetime(2030, 12, 31)).map(lambda d: d.replace(tzinfo=UTC)),
)
def test_every_occurrence_is_run_or_skipped_exactly_once(
    schedule: Schedule, tz: str, catch_up: CatchUp, gaps: list[int], start: datetime
) -> None:
    plan = PlanTiming(schedule=schedule, tz=tz, start=start, catch_up=catch_up, catch_up_cap=10_000)
    state = progress(first_fire_time(plan, start))
    fires: list[datetime] = []
    skipped = 0
    now = start
    for gap in gaps:
        now += timedelta(seconds=gap)
        new_fires, new_skipped, state, _ = run_until(plan, state, now)
        if catch_up is CatchUp.SKIP:
            assert all(f >= now - plan.misfire_grace for f in new_fires)
        if catch_up is CatchUp.RUN_ONCE:
            assert sum(f < now - plan.misfire_grace for f in new_fires) <= 1
        fires += new_fires
        skipped += new_skipped
    assert fires == sorted(set(fires))  # increasing: no occurrence twice
    occurrences = []
    cursor = next_after(schedule, plan.start - timedelta(microseconds=1), tz) if plan.start else None
    while cursor is not None and cursor <= now:
        occurrences.append(cursor)
        cursor = next_after(schedule, cursor, tz)
    assert set(fires) <= set(occurrences)
    assert len(fires) + skipped == len(occurrences)
    if catch_up is CatchUp.RUN_ALL:
        assert fires == occurrences
    assert state.next_fire_time == cursor


# -- validation -----------------------------------------------------------------------------------

NAIVE = datetime(2030, 1, 1)
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"tz": "Europe/Atlantis"}, "tz"),
    ({"start": T0, "end": T0 - S}, "end"),
    ({"start": NAIVE}, "start"),
    ({"end": NAIVE}, "end"),
    ({"repeat": 0}, "repeat"),
    ({"repeat": -1}, "repeat"),
    ({"catch_up": "run_twice"}, "catch_up"),
    ({"catch_up_cap": 0}, "catch_up_cap"),
    ({"misfire_grace": -S}, "misfire_grace"),
    ({"schedule": {"kind": "weekly", "weekdays": [7]}}, r"schedule\.weekly\.weekdays"),
    ({"schedule": {"kind": "monthly", "day": 32}}, r"schedule\.monthly\.day"),
    ({"schedule": {"kind": "cron", "expression": "0 0 * * 8"}}, r"schedule\.cron\.expression"),
    ({"schedule": {"kind": "every", "interval": timedelta(0), "start": T0}}, r"schedule\.every\.interval"),
    ({"schedule": {"kind": "at", "at": NAIVE}}, r"schedule\.at\.at"),
    ({"surprise": 1}, "surprise"),
]


@pytest.mark.parametrize(("changes", "field"), INVALID)
def test_bad_plans_raise_invalid_input_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        timing(**changes)


def test_bad_step_inputs_raise_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="now"):
        plan_step(timing(), progress(T0), NAIVE)
    with pytest.raises(InvalidInput, match="now"):
        first_fire_time(timing(), NAIVE)
    with pytest.raises(InvalidInput, match="run_end"):
        next_fire_after_completion(timing(), 0, NAIVE)
    with pytest.raises(InvalidInput, match="skip_next"):
        progress(T0, skip_next=-1)
    with pytest.raises(InvalidInput, match="next_fire_time"):
        progress(NAIVE)
    with pytest.raises(InvalidInput, match="scan_limit"):
        plan_step(timing(), progress(T0), T0, scan_limit=0)
