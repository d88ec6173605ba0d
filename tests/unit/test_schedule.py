"""Schedule arithmetic against independent references (dateutil.rrule, cronsim's own DST handling)."""

from __future__ import annotations

import calendar
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from dateutil import rrule
from dateutil import tz as dtz
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.schedule import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    MonthlySchedule,
    Schedule,
    WeeklySchedule,
    month_day,
    next_after,
    parse_schedule,
    resolve_local,
)

ZONES = ["Europe/Berlin", "America/New_York"]
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
H = timedelta(hours=1)


# -- independent references -----------------------------------------------------------------------


def ref_resolve(wall: datetime, tz: str) -> datetime:
    """dateutil's reading of a local wall time: a gap moves minute by minute to the first existing
    minute (transitions are on whole minutes in these zones), an ambiguous time takes fold 0."""
    zone = dtz.gettz(tz)
    assert zone is not None
    candidate = wall.replace(tzinfo=zone)
    if not dtz.datetime_exists(candidate):
        candidate = candidate.replace(second=0, microsecond=0)
        while not dtz.datetime_exists(candidate):
            candidate += timedelta(minutes=1)
    return dtz.enfold(candidate, fold=0).astimezone(UTC)


def ref_next(walls: Iterator[datetime], tz: str, after: datetime) -> datetime | None:
    for wall in walls:
        found = ref_resolve(wall, tz)
        if found > after:
            return found
    return None


def local_start(after: datetime, tz: str, days_back: int = 3) -> datetime:
    zone = dtz.gettz(tz)
    local = after.astimezone(zone).replace(tzinfo=None)
    return datetime.combine(local.date() - timedelta(days=days_back), time(0))


def dst_changes(tz: str) -> list[datetime]:
    """Hand-computed DST change days (Berlin: last Sundays of March and October; New York: second
    Sunday of March, first Sunday of November), at local noon of the day before."""
    out = []
    for year in range(2021, 2036):
        if tz == "Europe/Berlin":
            days = [max(d for d in _sundays(year, 3)), max(d for d in _sundays(year, 10))]
        else:
            days = [_sundays(year, 3)[1], _sundays(year, 11)[0]]
        out += [datetime.combine(d - timedelta(days=1), time(12), tzinfo=ZoneInfo(tz)) for d in days]
    return out


def _sundays(year: int, month: int) -> list[date]:
    return [
        date(year, month, d)
        for d in range(1, calendar.monthrange(year, month)[1] + 1)
        if date(year, month, d).weekday() == 6
    ]


# Instants: anywhere in 2021-2035, or within two days of a DST change, a month end or a leap day.
_SPECIAL = (
    [d.astimezone(UTC) for tz in ZONES for d in dst_changes(tz)]
    + [
        datetime(y, m, calendar.monthrange(y, m)[1], 12, tzinfo=UTC)
        for y in (2023, 2024)
        for m in range(1, 13)
    ]
    + [datetime(y, 2, 28, 12, tzinfo=UTC) for y in (2024, 2028, 2100)]
)
instants = st.one_of(
    st.datetimes(datetime(2021, 1, 1), datetime(2035, 12, 31)).map(lambda d: d.replace(tzinfo=UTC)),
    st.builds(
        lambda base, offset: base + timedelta(seconds=offset),
        st.sampled_from(_SPECIAL),
        st.integers(-2 * 86_400, 2 * 86_400),
    ),
)
# Local times that hit the DST gaps and repeated hours (01:xx, 02:xx) often.
local_times = st.builds(
    time,
    st.sampled_from([0, 1, 2, 3, 9, 23]) | st.integers(0, 23),
    st.sampled_from([0, 15, 30, 59]),
    st.sampled_from([0, 0, 30]),
)
zones = st.sampled_from(ZONES)


def chain(schedule: Schedule, after: datetime, tz: str, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        found = next_after(schedule, after, tz)
        assert found is not None
        out.append(found)
        after = found
    return out


# -- weekly ---------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    weekdays=st.sets(st.integers(0, 6), min_size=1),
    at=local_times,
    tz=zones,
    after=instants,
)
def test_weekly_matches_rrule(weekdays: set[int], at: time, tz: str, after: datetime) -> None:
    schedule = WeeklySchedule(weekdays=tuple(weekdays), local_time=at)
    walls = rrule.rrule(
        rrule.WEEKLY,
        byweekday=sorted(weekdays),
        byhour=at.hour,
        byminute=at.minute,
        bysecond=at.second,
        dtstart=local_start(after, tz),
    )
    got = chain(schedule, after, tz, 4)
    expected = []
    cursor = after
    for _ in range(4):
        found = ref_next(iter(walls), tz, cursor)
        assert found is not None
        expected.append(found)
        cursor = found
    assert got == expected


# -- monthly --------------------------------------------------------------------------------------


def monthly_rrule(day: int, at: time, dtstart: datetime) -> rrule.rrule:
    """The monthly rule, written with rrule's own clamping-free tools: bysetpos picks the last
    existing day of a set, and rrule's -1 is the last day (ours is 0)."""
    common: dict[str, Any] = {
        "byhour": at.hour,
        "byminute": at.minute,
        "bysecond": at.second,
        "dtstart": dtstart,
    }
    if 1 <= day <= 28:
        return rrule.rrule(rrule.MONTHLY, bymonthday=day, **common)
    if day > 28:
        return rrule.rrule(rrule.MONTHLY, bymonthday=list(range(28, day + 1)), bysetpos=-1, **common)
    if day == 0:
        return rrule.rrule(rrule.MONTHLY, bymonthday=-1, **common)
    return rrule.rrule(rrule.MONTHLY, bymonthday=[day - 1, 1], bysetpos=-1, **common)


@settings(max_examples=150, deadline=None)
@given(day=st.integers(-31, 31), at=local_times, tz=zones, after=instants)
def test_monthly_matches_rrule(day: int, at: time, tz: str, after: datetime) -> None:
    schedule = MonthlySchedule(day=day, local_time=at)
    walls = monthly_rrule(day, at, local_start(after, tz, days_back=40))
    got = chain(schedule, after, tz, 3)
    expected = []
    cursor = after
    for _ in range(3):
        found = ref_next(iter(walls), tz, cursor)
        assert found is not None
        expected.append(found)
        cursor = found
    assert got == expected


MONTH_LENGTHS = {28: (2023, 2), 29: (2024, 2), 30: (2024, 4), 31: (2024, 1)}


@pytest.mark.parametrize("length", sorted(MONTH_LENGTHS))
@pytest.mark.parametrize("day", range(-31, 32))
def test_monthly_day_rule_on_every_month_length(length: int, day: int) -> None:
    year, month = MONTH_LENGTHS[length]
    (expected_wall,) = monthly_rrule(day, time(12), datetime(year, month, 1)).between(
        datetime(year, month, 1), datetime(year, month, length, 23, 59), inc=True
    )
    assert month_day(year, month, day) == expected_wall.day
    schedule = MonthlySchedule(day=day, local_time=time(12))
    got = next_after(schedule, datetime(year, month, 1, tzinfo=UTC) - timedelta(seconds=1), "UTC")
    assert got == expected_wall.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("day", "by_length"),
    [
        (1, {28: 1, 29: 1, 30: 1, 31: 1}),
        (29, {28: 28, 29: 29, 30: 29, 31: 29}),
        (30, {28: 28, 29: 29, 30: 30, 31: 30}),
        (31, {28: 28, 29: 29, 30: 30, 31: 31}),
        (0, {28: 28, 29: 29, 30: 30, 31: 31}),
        (-1, {28: 27, 29: 28, 30: 29, 31: 30}),
        (-27, {28: 1, 29: 2, 30: 3, 31: 4}),
        (-28, {28: 1, 29: 1, 30: 2, 31: 3}),
        (-30, {28: 1, 29: 1, 30: 1, 31: 1}),
        (-31, {28: 1, 29: 1, 30: 1, 31: 1}),
    ],
)
def test_monthly_convention_by_hand(day: int, by_length: dict[int, int]) -> None:
    for length, expected in by_length.items():
        assert month_day(*MONTH_LENGTHS[length], day) == expected


# -- every ----------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(days=st.integers(1, 10), start=instants, tz=zones, offset=st.integers(-86_400, 400 * 86_400))
def test_every_n_days_keeps_the_local_wall_time(days: int, start: datetime, tz: str, offset: int) -> None:
    start = start.replace(microsecond=0)
    schedule = EverySchedule(interval=timedelta(days=days), start=start)
    after = start + timedelta(seconds=offset)
    wall = start.astimezone(dtz.gettz(tz)).replace(tzinfo=None)
    walls = iter(rrule.rrule(rrule.DAILY, interval=days, dtstart=wall))
    next(walls)  # the first occurrence is start itself
    want = start if start > after else ref_next(walls, tz, after)
    assert next_after(schedule, after, tz) == want


@settings(max_examples=150, deadline=None)
@given(
    seconds=st.integers(1, 30 * 86_400).filter(lambda s: s % 86_400),
    start=instants,
    tz=zones,
    offset=st.integers(-86_400, 400 * 86_400),
)
def test_every_non_day_interval_is_elapsed_time(seconds: int, start: datetime, tz: str, offset: int) -> None:
    interval = timedelta(seconds=seconds)
    schedule = EverySchedule(interval=interval, start=start)
    after = start + timedelta(seconds=offset)
    got = next_after(schedule, after, tz)
    assert got is not None
    assert got > after and (got - schedule.start) % interval == timedelta(0)
    assert got == schedule.start or got - interval <= after
    assert got == next_after(schedule, after, "UTC")  # the time zone does not matter


def test_every_six_hours_is_elapsed_across_dst_and_every_day_is_wall_clock() -> None:
    start = datetime(2030, 3, 30, 9, 0, tzinfo=BERLIN)
    six = chain(EverySchedule(interval=6 * H, start=start), start, "Europe/Berlin", 4)
    assert [t.astimezone(BERLIN).strftime("%d %H:%M") for t in six] == [
        "30 15:00",
        "30 21:00",
        "31 04:00",
        "31 10:00",
    ]
    daily = chain(EverySchedule(interval=24 * H, start=start), start, "Europe/Berlin", 2)
    assert [t.astimezone(BERLIN).isoformat() for t in daily] == [
        "2030-03-31T09:00:00+02:00",
        "2030-04-01T09:00:00+02:00",
    ]


def test_every_starts_with_start() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    schedule = EverySchedule(interval=timedelta(minutes=5), start=start)
    assert next_after(schedule, start - timedelta(days=3), "UTC") == start
    assert next_after(schedule, start, "UTC") == start + timedelta(minutes=5)


# -- cron -----------------------------------------------------------------------------------------

cron_fields = st.tuples(
    st.sampled_from(["0", "30", "*/15", "5,35", "*", "59"]),
    st.sampled_from(["2", "1", "3", "*", "*/6", "0-23/2", "9-17", "1,2"]),
    st.sampled_from(["*", "1", "15", "L", "31", "29"]),
    st.sampled_from(["*", "*", "3", "10,11", "*/2", "FEB"]),
    st.sampled_from(["*", "*", "0", "1-5", "SUN", "7", "MON#2"]),
).map(" ".join)


def cronsim_next(expression: str, after: datetime, tz: str) -> datetime:
    """cronsim's own (Debian cron) DST handling, which applies to 5-field expressions only."""
    for found in CronSim(expression, after.astimezone(ZoneInfo(tz))):
        if found > after:
            return found.astimezone(UTC)
    raise AssertionError("no occurrence")


@settings(max_examples=200, deadline=None)
@given(expression=cron_fields, tz=zones, after=instants)
def test_five_field_cron_matches_cronsims_debian_dst_rules(expression: str, tz: str, after: datetime) -> None:
    try:
        schedule = CronSchedule(expression=expression)
    except InvalidInput:
        assume(False)
        raise
    got = next_after(schedule, after, tz)
    assert got == cronsim_next(expression, after, tz)
    # A 6-field expression with a zero seconds field is the same schedule.
    assert next_after(CronSchedule(expression="0 " + expression), after, tz) == got


@pytest.mark.parametrize(
    ("expression", "tz", "after_local", "expected_local"),
    [
        # A fixed time in Berlin's spring-forward gap runs once, at the transition.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2030-03-30T12:00",
            ["2030-03-31T03:00+02:00", "2030-04-01T02:30+02:00"],
        ),
        (
            "0 30 2 * * *",
            "Europe/Berlin",
            "2030-03-30T12:00",
            ["2030-03-31T03:00+02:00", "2030-04-01T02:30+02:00"],
        ),
        # A fixed time in Berlin's repeated hour runs once, the first time.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2030-10-26T12:00",
            ["2030-10-27T02:30+02:00", "2030-10-28T02:30+01:00"],
        ),
        (
            "15 30 2 * * *",
            "Europe/Berlin",
            "2030-10-26T12:00",
            ["2030-10-27T02:30:15+02:00", "2030-10-28T02:30:15+01:00"],
        ),
        # New York: 01:30 is repeated on 2030-11-03, 02:30 skipped on 2030-03-10.
        (
            "30 1 * * *",
            "America/New_York",
            "2030-11-02T12:00",
            ["2030-11-03T01:30-04:00", "2030-11-04T01:30-05:00"],
        ),
        (
            "30 2 * * *",
            "America/New_York",
            "2030-03-09T12:00",
            ["2030-03-10T03:00-04:00", "2030-03-11T02:30-04:00"],
        ),
        # Wildcard hours run on elapsed time: both passes of the repeated hour, none in the gap.
        (
            "*/30 * * * *",
            "America/New_York",
            "2030-11-03T00:45",
            [
                "2030-11-03T01:00-04:00",
                "2030-11-03T01:30-04:00",
                "2030-11-03T01:00-05:00",
                "2030-11-03T01:30-05:00",
                "2030-11-03T02:00-05:00",
            ],
        ),
        (
            "0 * * * *",
            "Europe/Berlin",
            "2030-03-31T00:30",
            ["2030-03-31T01:00+01:00", "2030-03-31T03:00+02:00"],
        ),
        ("@daily", "Europe/Berlin", "2030-01-01T12:00", ["2030-01-02T00:00+01:00"]),
        ("@hourly", "UTC", "2030-01-01T12:00", ["2030-01-01T13:00+00:00"]),
        ("0 9 * * MON-FRI", "Europe/Berlin", "2030-01-04T10:00", ["2030-01-07T09:00+01:00"]),  # Fri -> Mon
        ("0 0 29 2 *", "UTC", "2030-01-01T00:00", ["2032-02-29T00:00+00:00"]),
    ],
)
def test_cron_dst_cases_by_hand(
    expression: str, tz: str, after_local: str, expected_local: list[str]
) -> None:
    after = datetime.fromisoformat(after_local).replace(tzinfo=ZoneInfo(tz))
    got = chain(CronSchedule(expression=expression), after, tz, len(expected_local))
    assert got == [datetime.fromisoformat(e) for e in expected_local]


# -- DST rules shared by the local-time kinds -----------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "tz", "after", "expected"),
    [
        (
            WeeklySchedule(weekdays=(6,), local_time=time(2, 30)),
            "Europe/Berlin",
            "2030-03-30T12:00+01:00",
            "2030-03-31T03:00+02:00",
        ),
        (
            WeeklySchedule(weekdays=(6,), local_time=time(2, 30)),
            "Europe/Berlin",
            "2030-10-26T12:00+02:00",
            "2030-10-27T02:30+02:00",
        ),
        (
            MonthlySchedule(day=10, local_time=time(2, 30)),
            "America/New_York",
            "2030-03-01T00:00-05:00",
            "2030-03-10T03:00-04:00",
        ),
        (
            MonthlySchedule(day=3, local_time=time(1, 30)),
            "America/New_York",
            "2030-11-01T00:00-04:00",
            "2030-11-03T01:30-04:00",
        ),
        (
            EverySchedule(interval=timedelta(days=1), start=datetime.fromisoformat("2030-03-29T02:30+01:00")),
            "Europe/Berlin",
            "2030-03-30T12:00+01:00",
            "2030-03-31T03:00+02:00",
        ),
    ],
)
def test_gap_runs_at_the_transition_and_a_repeated_time_runs_once(
    schedule: Schedule, tz: str, after: str, expected: str
) -> None:
    got = next_after(schedule, datetime.fromisoformat(after), tz)
    assert got == datetime.fromisoformat(expected)
    assert got is not None
    # Once only: the next occurrence is a whole day or more later.
    following = next_after(schedule, got, tz)
    assert following is not None and following - got >= timedelta(hours=23)


def test_an_after_in_the_second_pass_of_a_repeated_hour_does_not_fire_again() -> None:
    second_pass = datetime.fromisoformat("2030-11-03T01:15-05:00")  # New York, EST
    schedule = CronSchedule(expression="30 1 * * *")
    assert next_after(schedule, second_pass, "America/New_York") == datetime.fromisoformat(
        "2030-11-04T01:30-05:00"
    )


def test_resolve_local_spans_a_whole_skipped_day() -> None:
    # Samoa skipped 2011-12-30 when it moved across the date line.
    apia = ZoneInfo("Pacific/Apia")
    got = resolve_local(datetime(2011, 12, 30, 12), apia)
    assert got.astimezone(apia) == datetime(2011, 12, 31, 0, 0, tzinfo=apia)


# -- at, limits, results --------------------------------------------------------------------------


def test_at_fires_once() -> None:
    at = datetime(2030, 5, 1, 8, tzinfo=UTC)
    schedule = AtSchedule(at=at)
    assert next_after(schedule, at - timedelta(seconds=1)) == at
    assert next_after(schedule, at) is None


def test_results_are_utc_milliseconds_and_the_far_future_ends() -> None:
    schedule = AtSchedule(at=datetime(2030, 5, 1, 8, 0, 0, 123_456, tzinfo=BERLIN))
    got = next_after(schedule, datetime(2030, 1, 1, tzinfo=UTC))
    assert got == datetime(2030, 5, 1, 6, 0, 0, 123_000, tzinfo=UTC) and got.tzinfo is UTC
    far = datetime(9999, 12, 30, tzinfo=UTC)
    assert next_after(EverySchedule(interval=timedelta(days=7), start=far), far) is None
    assert next_after(MonthlySchedule(day=1), far, "Europe/Berlin") is None
    assert next_after(CronSchedule(expression="0 0 1 1 *"), far) is None


# -- storage --------------------------------------------------------------------------------------

schedules: st.SearchStrategy[Schedule] = st.one_of(
    st.builds(AtSchedule, at=instants),
    st.builds(
        EverySchedule, interval=st.integers(1, 10**6).map(lambda s: timedelta(seconds=s)), start=instants
    ),
    st.builds(
        WeeklySchedule, weekdays=st.sets(st.integers(0, 6), min_size=1).map(tuple), local_time=local_times
    ),
    st.builds(MonthlySchedule, day=st.integers(-31, 31), local_time=local_times),
    st.builds(CronSchedule, expression=cron_fields.filter(lambda e: "31 FEB" not in e and "31 */2" not in e)),
)


@settings(max_examples=150, deadline=None)
@given(schedule=schedules)
def test_storage_round_trips(schedule: Schedule) -> None:
    doc = schedule.to_storage()
    plain = {k: v for k, v in doc.items() if not isinstance(v, datetime)}
    assert json.loads(json.dumps(plain)) == plain  # instants stay datetimes, as MongoDB keeps them
    assert Schedule.from_storage(doc) == schedule


def test_storage_shape() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    assert EverySchedule(interval=timedelta(minutes=5), start=start).to_storage() == {
        "kind": "every",
        "interval_ms": 300_000,
        "start": start,
    }
    assert WeeklySchedule(weekdays=(4, 0, 4), local_time=time(9, 30)).to_storage() == {
        "kind": "weekly",
        "weekdays": [0, 4],
        "local_time": "09:30:00",
    }


# -- validation -----------------------------------------------------------------------------------

NAIVE = datetime(2030, 1, 1)
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"kind": "weekly", "weekdays": [7]}, "weekly.weekdays"),
    ({"kind": "weekly", "weekdays": [-1]}, "weekly.weekdays"),
    ({"kind": "weekly", "weekdays": []}, "weekly.weekdays"),
    ({"kind": "weekly", "weekdays": [1], "local_time": time(9, tzinfo=UTC)}, "weekly.local_time"),
    ({"kind": "monthly", "day": 32}, "monthly.day"),
    ({"kind": "monthly", "day": -32}, "monthly.day"),
    ({"kind": "cron", "expression": "61 * * * *"}, "cron.expression"),
    ({"kind": "cron", "expression": "* * * *"}, "cron.expression"),
    ({"kind": "cron", "expression": "* * * * * * *"}, "cron.expression"),
    ({"kind": "cron", "expression": "0 0 30 2 *"}, "cron.expression"),
    ({"kind": "cron", "expression": "*/0 * * * *"}, "cron.expression"),
    ({"kind": "cron", "expression": "@reboot"}, "cron.expression"),
    ({"kind": "cron", "expression": "a b c d e"}, "cron.expression"),
    (
        {"kind": "every", "interval": timedelta(0), "start": datetime(2030, 1, 1, tzinfo=UTC)},
        "every.interval",
    ),
    (
        {"kind": "every", "interval": timedelta(seconds=-5), "start": datetime(2030, 1, 1, tzinfo=UTC)},
        "every.interval",
    ),
    ({"kind": "every", "interval": timedelta(seconds=60), "start": NAIVE}, "every.start"),
    ({"kind": "at", "at": NAIVE}, "at.at"),
    ({"kind": "yearly"}, "kind"),
    ({"kind": "at", "at": datetime(2030, 1, 1, tzinfo=UTC), "tz": "UTC"}, "at.tz"),
]


@pytest.mark.parametrize(("data", "field"), INVALID)
def test_bad_schedules_raise_invalid_input_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        parse_schedule(data)


@settings(max_examples=200, deadline=None)
@given(expression=st.text(alphabet="0123456789*/,-#LW? ABCDEFGHIJKLMNOPQRSTUVWXYZ@", max_size=30))
def test_any_cron_text_is_accepted_or_refused_with_invalid_input(expression: str) -> None:
    try:
        schedule = CronSchedule(expression=expression)
    except InvalidInput:
        return
    assert next_after(schedule, datetime(2030, 1, 1, tzinfo=UTC), "Europe/Berlin") is not None


def test_bad_arguments_raise_invalid_input() -> None:
    schedule = WeeklySchedule(weekdays=(0,))
    with pytest.raises(InvalidInput, match="after"):
        next_after(schedule, NAIVE, "UTC")
    with pytest.raises(InvalidInput, match="tz: unknown time zone"):
        next_after(schedule, datetime(2030, 1, 1, tzinfo=UTC), "Europe/Nowhere")
