"""Schedules and the planner's pure arithmetic: no I/O, no asyncio, no storage.

A plan's schedule says *when* its occurrences are; an occurrence is identified by its scheduled
fire time (the task key is derived from (plan id, fire time)), so every function here is
deterministic: the same inputs give the same fire times in every process.

Schedule kinds (a pydantic union discriminated on ``kind``)
-------------------------------------------------------------

========== =============================================================================================
``at``      one instant ``at``.
``every``   ``start``, ``start + interval``, ``start + 2*interval``, … An interval that is a whole
            number of days is counted in **local calendar days** in the plan's time zone (the
            occurrence keeps ``start``'s local wall-clock time across DST changes: "every day at
            09:00" stays at 09:00); any other interval is **elapsed time** (``every 6 hours`` is
            exactly 6 h apart, 5 h or 7 h of wall-clock time across a DST change). Note that
            ``timedelta(hours=24) == timedelta(days=1)``: both are "every day". The first occurrence
            is ``start`` itself.
``weekly``  on each of ``weekdays`` (0 = Monday … 6 = Sunday, Python's convention, *not* cron's) at
            the local time ``local_time``.
``monthly`` on a day of each month at ``local_time``; ``day`` is resolved in a month of ``L`` days as:
            ``1..31`` → ``min(day, L)`` (31 is the last day of every month, 30 in February is
            the 28th/29th); ``0`` → ``L`` (the last day); ``-1..-31`` → ``max(L + day, 1)``, i.e.
            counted back from the last day: -1 is the day before the last (the 30th of a
            31-day month, the 27th of a 28-day February), and a result below 1 is the 1st
            (-30 in February is the 1st). This is seed 003's rule ("the last day plus the number,
            the 1st if below 1").
``cron``    a cron expression evaluated in the plan's time zone: 5 fields (minute hour day-of-month
            month day-of-week) or 6 fields with **seconds first** (second minute hour …), as in
            Quartz / Spring / cronsim; plus the macros ``@yearly`` (``@annually``), ``@monthly``,
            ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly``. Day-of-week is cron's
            0..7 (0 and 7 = Sunday) and names (MON…); ``L``, ``LW``, ``#n`` are supported.
========== =============================================================================================

DST rules (local-time schedules: weekly, monthly, every-N-days, cron at a fixed time)
-----------------------------------------------------------------------------------------
* A local time that does not exist (spring forward) fires at the next valid instant: the moment
  of the transition (02:30 on Berlin's spring-forward day → 03:00 CEST).
* An ambiguous local time (fall back) fires once, at its first occurrence (``fold=0``).
* A cron expression is "at a fixed time" when its minute and hour fields do not start with
  ``*`` (Debian cron's rule, which cronsim follows): such expressions get the two rules above.
  Other expressions (``*/15 * * * *``, ``0 * * * *``) run on elapsed time: every matching real
  instant fires, so an hourly job runs in both passes of a repeated hour and the skipped hour has
  no run. 5-field and 6-field expressions follow the same rule here (cronsim itself applies it to
  5-field ones only).

Cron library: cronsim
---------------------
Chosen from the package lists over croniter and cron-converter: it is maintained (2.8, 2026),
small, has no dependencies, ships type hints (``py.typed``), and is DST-correct the way Debian
cron is: a 5-field job at a fixed time runs once at the next valid instant in a gap and once in
a repeated hour. croniter (7.0) fires a fixed-time job *twice* in a repeated hour (02:30 on
Berlin's fall-back day), needs dateutil and separate stubs, and puts seconds *last* in 6-field
expressions; cron-converter is far less used. We evaluate fixed-time expressions on naive local
wall time with cronsim and resolve each wall time ourselves (``resolve_local``), so 6-field
expressions get the same DST rules as 5-field ones.

The planner's step
------------------
``plan_step(timing, progress, now)`` returns the fire times to materialise now and the new stored
``next_fire_time`` (the compare-and-set value). An occurrence is **late** when it is older than
``now - misfire_grace`` (default 60 s, which absorbs the planner's normal latency). Due
occurrences are visited oldest first; each one first uses a skip-next token if any is left
(``skip_next`` counts occurrences passed over on purpose, late or not, and they are not runs),
then the catch-up policy decides:

=================== ==============================================================================
``skip`` (default)   late occurrences are skipped; on-time ones run. A plan whose remaining
                     occurrences are all late ends without running (a one-off ``at`` in the past
                     ends unrun).
``run_once``         the late occurrences are coalesced into one run, at the latest late fire time;
                     on-time ones run as usual. Then the schedule resumes.
``run_all``          every late occurrence runs, but only the most recent ``catch_up_cap`` of them
                     (default 100); older ones are skipped.
``after_completion`` the due occurrence runs however late; the step then waits (``next_fire_time``
                     is None and ``awaiting_completion`` is True) until the run ends, and
                     ``next_fire_after_completion`` counts the next interval from the run's end
                     (seed 003's ``no_keep=true``).
=================== ==============================================================================

``repeat`` (None = forever) limits the runs made; ``start`` / ``end`` (inclusive) bound the
occurrences. Without ``start`` a recurring plan begins at its creation time (``first_fire_time``'s
``now``) and an ``at`` plan at its instant. All instants are timezone-aware UTC, cut to
milliseconds (what MongoDB stores).
"""

from __future__ import annotations

import functools
import zoneinfo
from collections import deque
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mscheduler.domain.clock import truncate_ms
from mscheduler.domain.exceptions import InvalidInput, error_reason

_MS = timedelta(milliseconds=1)
_ONE_DAY = timedelta(days=1)
_TINY = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_INTERVAL = timedelta(days=366 * 100)
DEFAULT_MISFIRE_GRACE = timedelta(seconds=60)
DEFAULT_CATCH_UP_CAP = 100
DEFAULT_SCAN_LIMIT = 10_000

# -- shared helpers (also used by mscheduler.domain.retry) ------------------------------------------------


def utc_ms(value: datetime) -> datetime:
    """UTC, cut to milliseconds: what MongoDB stores, so every process computes the same instant.
    A time whose UTC is outside years 1-9999 is a ValueError (refused as bad input)."""
    try:
        return truncate_ms(value.astimezone(UTC))
    except OverflowError:
        raise ValueError("is out of range: in UTC it would be before year 1 or after year 9999") from None


def require_aware(value: datetime, name: str) -> datetime:
    """Refuse a naive datetime, or one out of range in UTC (raises InvalidInput naming the
    argument); return it in UTC."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{name} must be a timezone-aware datetime (e.g. datetime.now(UTC))")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(
            f"{name} is out of range: in UTC it would be before year 1 or after 9999"
        ) from None


@functools.cache
def _iana_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def check_zone_name(name: str) -> str:
    """Validate an IANA time zone name (raises ValueError, for use inside pydantic validators)."""
    if name != "UTC" and name not in _iana_names():
        raise ValueError("unknown time zone: use an IANA name such as 'Europe/Berlin' or 'UTC'")
    return name


def get_zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; an unknown name raises InvalidInput naming ``tz``."""
    try:
        return ZoneInfo(check_zone_name(name))
    except ValueError as exc:
        raise InvalidInput(f"tz: {exc}") from exc


def resolve_local(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant (aware UTC) of the naive local wall time ``wall`` in ``zone``, DST-correct.

    An ambiguous wall time (fall back) gives its first instant (``fold=0``); a wall time that does
    not exist (spring forward) gives the next valid instant, the moment of the transition.
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # In a gap the two folds read the wall time with the offsets before and after the transition;
    # the transition lies between them: find the first whole second whose wall time is past `wall`.
    other = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    lo, hi = min(first, other), max(first, other)
    lo_s, hi_s = (lo - _EPOCH) // timedelta(seconds=1), -((_EPOCH - hi) // timedelta(seconds=1))
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if (_EPOCH + timedelta(seconds=mid)).astimezone(zone).replace(tzinfo=None) > wall:
            hi_s = mid
        else:
            lo_s = mid
    return _EPOCH + timedelta(seconds=hi_s)


def month_day(year: int, month: int, day: int) -> int:
    """The day of ``year``-``month`` that the monthly rule ``day`` (-31..31) names (see module doc)."""
    last = _days_in_month(year, month)
    if day > 0:
        return min(day, last)
    return max(last + day, 1)


def _days_in_month(year: int, month: int) -> int:
    following = date(year + 1, 1, 1) if month == 12 else date(year, month + 1, 1)
    return (following - timedelta(days=1)).day


class _FieldErrors(InvalidInput):
    """InvalidInput from validation; ``fields`` lists (dotted field path, message) pairs."""

    def __init__(self, what: str, fields: list[tuple[str, str]]) -> None:
        super().__init__(
            f"invalid {what}: " + "; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in fields)
        )
        self.fields = fields


def invalid_input(what: str, exc: ValidationError) -> InvalidInput:
    """Translate a pydantic error into InvalidInput whose message names each bad field."""
    fields: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"])
        inner = err.get("ctx", {}).get("error")
        if isinstance(inner, _FieldErrors):  # a nested value's own __init__ refused it
            fields.extend((".".join(filter(None, (loc, sub))), msg) for sub, msg in inner.fields)
        else:
            fields.append((loc, error_reason(err)))
    return _FieldErrors(what, fields)


class FrozenModel(BaseModel):
    """An immutable value whose construction raises InvalidInput (naming the field), not ValidationError."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "value"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_input(self.what, exc) from exc


def _ms(value: timedelta) -> int:
    return value // _MS


def to_storage_dict(model: BaseModel) -> dict[str, Any]:
    """A model as plain JSON-like values for storage: durations as ``<name>_ms``, times as "HH:MM:SS"."""
    out: dict[str, Any] = {}
    for name in sorted(type(model).model_fields, key=lambda name: name != "kind"):  # kind first
        value = getattr(model, name)
        if isinstance(value, timedelta):
            out[f"{name}_ms"] = _ms(value)
        elif isinstance(value, time):
            out[name] = value.isoformat()
        elif isinstance(value, BaseModel):
            out[name] = to_storage_dict(value)
        elif isinstance(value, tuple):
            out[name] = list(value)
        elif isinstance(value, StrEnum):
            out[name] = value.value
        else:
            out[name] = value
    return out


def from_storage_dict(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Undo ``to_storage_dict``'s renaming: ``<name>_ms`` back to a timedelta under ``<name>``."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key.endswith("_ms") and isinstance(value, int) and not isinstance(value, bool):
            out[key.removesuffix("_ms")] = timedelta(milliseconds=value)
        elif isinstance(value, Mapping):
            out[key] = from_storage_dict(value)
        else:
            out[key] = value
    return out


def _check_local_time(value: time) -> time:
    if value.tzinfo is not None:
        raise ValueError("must be a naive local time: the plan's tz says where it is")
    if value.microsecond:
        raise ValueError("must be a whole number of seconds")
    return value


def _check_instant(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be timezone-aware (e.g. datetime.now(UTC))")
    return utc_ms(value)


Instant = Annotated[datetime, AfterValidator(_check_instant)]
LocalTime = Annotated[time, AfterValidator(_check_local_time)]


# -- schedules ------------------------------------------------------------------------------------


class Schedule(FrozenModel):
    """When a plan's occurrences are. Use one of the kinds below; ``AnySchedule`` is their union."""

    what: ClassVar[str] = "schedule"

    def next_after(self, after: datetime, tz: str = "UTC") -> datetime | None:
        """The first occurrence strictly after ``after`` (aware UTC), or None if there is none."""
        after = require_aware(after, "after")
        try:
            found = self._next_after(after, get_zone(tz))
        except (OverflowError, ValueError) as exc:  # past year 9999
            if isinstance(exc, InvalidInput):
                raise
            return None
        return None if found is None else utc_ms(found)

    def _next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        raise NotImplementedError

    def to_storage(self) -> dict[str, Any]:
        """Plain values for storage (durations in ms; instants stay datetimes, as MongoDB keeps them)."""
        return to_storage_dict(self)

    @staticmethod
    def from_storage(doc: Mapping[str, Any]) -> AnySchedule:
        """A schedule from ``to_storage``'s output (or user JSON); bad input raises InvalidInput."""
        return parse_schedule(from_storage_dict(doc))


class AtSchedule(Schedule):
    """Once, at the instant ``at``."""

    kind: Literal["at"] = "at"
    at: Instant

    def _next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        return self.at if self.at > after else None


class EverySchedule(Schedule):
    """``start`` + k * ``interval`` (k ≥ 0); whole-day intervals are local calendar days."""

    kind: Literal["every"] = "every"
    interval: timedelta = Field(description="at least 1 s; whole days count local calendar days")
    start: Instant = Field(description="the first occurrence, which anchors the others")

    @field_validator("interval")
    @classmethod
    def _check_interval(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be positive")
        if value < timedelta(seconds=1) or value > MAX_INTERVAL:
            raise ValueError("must be between 1 second and 100 years")
        return truncate_interval(value)

    @property
    def local_days(self) -> bool:
        """True when the interval is whole days, counted on the local calendar (DST-correct)."""
        return self.interval % _ONE_DAY == timedelta(0)

    def _next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        if after < self.start:
            return self.start
        if not self.local_days:
            return self.start + ((after - self.start) // self.interval + 1) * self.interval
        wall = self.start.astimezone(zone).replace(tzinfo=None)
        step = self.interval.days
        k = max(1, (after.astimezone(zone).date() - wall.date()).days // step - 1)
        while True:
            found = resolve_local(wall + timedelta(days=k * step), zone)
            if found > after:
                return found
            k += 1


def truncate_interval(value: timedelta) -> timedelta:
    """Cut a duration to whole milliseconds (what storage keeps)."""
    return (value // _MS) * _MS


class WeeklySchedule(Schedule):
    """On each of ``weekdays`` (0 = Monday … 6 = Sunday) at the local time ``local_time``."""

    kind: Literal["weekly"] = "weekly"
    weekdays: tuple[int, ...] = Field(min_length=1, description="0 = Monday … 6 = Sunday")
    local_time: LocalTime = time(0, 0)

    @field_validator("weekdays")
    @classmethod
    def _check_weekdays(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        for weekday in value:
            if not 0 <= weekday <= 6:
                raise ValueError(f"weekday must be 0 (Monday) .. 6 (Sunday), got {weekday}")
        return tuple(sorted(set(value)))

    def _next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        # Start a day early: a candidate's instant can only move later than its wall time (a gap).
        day = after.astimezone(zone).date() - _ONE_DAY
        for _ in range(9):
            if day.weekday() in self.weekdays:
                found = resolve_local(datetime.combine(day, self.local_time), zone)
                if found > after:
                    return found
            day += _ONE_DAY
        raise AssertionError("unreachable: every weekday comes within 9 days")


class MonthlySchedule(Schedule):
    """On day ``day`` of every month at ``local_time``: 1..31 clamped, 0 = last, -n back from the last."""

    kind: Literal["monthly"] = "monthly"
    day: int = Field(description="1..31 (clamped to the last day), 0 = last day, -1..-31 back from it")
    local_time: LocalTime = time(0, 0)

    @field_validator("day")
    @classmethod
    def _check_day(cls, value: int) -> int:
        if not -31 <= value <= 31:
            raise ValueError(f"month day must be -31..31 (0 = the last day), got {value}")
        return value

    def _next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        local = after.astimezone(zone).date()
        year, month = (local.year, local.month - 1) if local.month > 1 else (local.year - 1, 12)
        for _ in range(4):
            day = date(year, month, month_day(year, month, self.day))
            found = resolve_local(datetime.combine(day, self.local_time), zone)
            if found > after:
                return found
            year, month = (year, month + 1) if month < 12 else (year + 1, 1)
        raise AssertionError("unreachable: every month has the day")


CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class CronSchedule(Schedule):
    """A cron expression (5 fields, or 6 with seconds first, or a macro) in the plan's time zone."""

    kind: Literal["cron"] = "cron"
    expression: str = Field(max_length=1000)

    @field_validator("expression")
    @classmethod
    def _check_expression(cls, value: str) -> str:
        value = " ".join(value.split())
        expanded = CRON_MACROS.get(value.lower(), value)
        if len(expanded.split()) not in (5, 6):
            raise ValueError("a cron expression must have 5 or 6 fields (or be a macro like @daily)")
        try:
            next(CronSim(expanded, datetime(2000, 1, 1)))
        except StopIteration:
            raise ValueError("the cron expression never fires") from None
        except Exception as exc:  # cronsim raises CronSimError, but odd input can raise others
            raise ValueError(f"invalid cron expression: {exc}") from None
        return value

    @property
    def fields(self) -> str:
        """The expression with macros expanded."""
        return CRON_MACROS.get(self.expression.lower(), self.expression)

    @property
    def fixed_time(self) -> bool:
        """True when minute and hour are not wildcards: such jobs follow wall-clock DST rules."""
        parts = self.fields.split()
        minute, hour = parts[-5], parts[-4]
        return not minute.startswith("*") and not hour.startswith("*")

    def _next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        try:
            if not self.fixed_time:
                found: datetime = next(CronSim(self.fields, after.astimezone(zone)))
                return found
            # Walk naive local wall times; a candidate resolved to an instant not after `after`
            # (the first pass of a repeated hour, a gap collapsed onto its transition) is passed over.
            for wall in CronSim(self.fields, after.astimezone(zone).replace(tzinfo=None)):
                found = resolve_local(wall, zone)
                if found > after:
                    return found
        except StopIteration:  # cronsim gives up after 50 years without a match
            return None
        return None


AnySchedule = Annotated[
    AtSchedule | EverySchedule | WeeklySchedule | MonthlySchedule | CronSchedule,
    Field(discriminator="kind"),
]
_SCHEDULE_ADAPTER: TypeAdapter[AnySchedule] = TypeAdapter(AnySchedule)


def parse_schedule(data: Mapping[str, Any] | Schedule) -> AnySchedule:
    """A schedule from a mapping with a ``kind`` (bad input raises InvalidInput naming the field)."""
    if isinstance(data, AtSchedule | EverySchedule | WeeklySchedule | MonthlySchedule | CronSchedule):
        return data
    try:
        return _SCHEDULE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise invalid_input("schedule", exc) from exc


def next_after(schedule: Schedule, after: datetime, tz: str = "UTC") -> datetime | None:
    """The first occurrence of ``schedule`` strictly after ``after``, in ``tz`` (aware UTC in and out)."""
    return schedule.next_after(after, tz)


# -- plans: the planner's pure step --------------------------------------------------------------


class CatchUp(StrEnum):
    """What a plan does with occurrences missed while nothing materialised them (see module doc)."""

    SKIP = "skip"
    RUN_ONCE = "run_once"
    RUN_ALL = "run_all"
    AFTER_COMPLETION = "after_completion"


class PlanTiming(FrozenModel):
    """The timing part of a plan: schedule, time zone, window, repeat count, catch-up policy."""

    what: ClassVar[str] = "plan timing"

    schedule: AnySchedule
    tz: str = Field("UTC", description="IANA time zone of the local-time schedules")
    start: datetime | None = Field(None, description="no occurrence before this instant")
    end: datetime | None = Field(None, description="no occurrence after this instant (inclusive)")
    repeat: int | None = Field(None, ge=1, le=10**12, description="runs to make; None = forever")
    catch_up: CatchUp = CatchUp.SKIP
    catch_up_cap: int = Field(DEFAULT_CATCH_UP_CAP, ge=1, le=10_000, description="run_all: most missed runs")
    misfire_grace: timedelta = Field(DEFAULT_MISFIRE_GRACE, description="older than this = missed")

    @field_validator("tz")
    @classmethod
    def _check_tz(cls, value: str) -> str:
        return check_zone_name(value)

    @field_validator("start", "end")
    @classmethod
    def _check_bounds(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _check_instant(value)

    @field_validator("misfire_grace")
    @classmethod
    def _check_grace(cls, value: timedelta) -> timedelta:
        if value < timedelta(0) or value > timedelta(days=366):
            raise ValueError("must be between 0 and 366 days")
        return truncate_interval(value)

    @field_validator("end")
    @classmethod
    def _check_window(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        start = info.data.get("start")
        if value is not None and start is not None and value < start:
            raise ValueError(f"{value.isoformat()} is before start {start.isoformat()}")
        return value

    def next_occurrence(self, after: datetime) -> datetime | None:
        """The schedule's next occurrence strictly after ``after`` that is within ``end``."""
        found = self.schedule.next_after(after, self.tz)
        if found is None or (self.end is not None and found > self.end):
            return None
        return found


class PlanProgress(FrozenModel):
    """What the plan's document says now: the planner's input besides the timing."""

    what: ClassVar[str] = "plan progress"

    runs_made: int = Field(0, ge=0)
    next_fire_time: datetime | None = Field(description="stored value; None = ended or awaiting")
    skip_next: int = Field(0, ge=0, le=10**9, description="occurrences still to pass over")

    @field_validator("next_fire_time")
    @classmethod
    def _check_next(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _check_instant(value)


class PlanStep(FrozenModel):
    """The outcome of one planner step: what to materialise and what to store."""

    what: ClassVar[str] = "plan step"

    fire_times: tuple[datetime, ...] = Field(description="occurrences to run now, oldest first")
    next_fire_time: datetime | None = Field(description="new stored value")
    skipped_cnt: int = Field(description="occurrences passed over (late under the policy or skip_next)")
    skip_next: int = Field(description="skip-next tokens left")
    runs_made: int = Field(description="runs made including fire_times")
    ended: bool = Field(description="no occurrence will ever be due again")
    awaiting_completion: bool = Field(
        False, description="after_completion: next_fire_time is set when the run ends"
    )
    more_due: bool = Field(False, description="the scan limit stopped the step: call it again")


def first_fire_time(timing: PlanTiming, now: datetime) -> datetime | None:
    """The ``next_fire_time`` of a new plan: the first occurrence at or after ``start``.

    Without ``start`` a recurring plan begins at ``now`` (its creation) and an ``at`` plan at its
    instant (so a past one-off still reaches the catch-up policy). None: the plan never fires.
    """
    now = require_aware(now, "now")
    if timing.start is not None:
        begin = timing.start
    elif isinstance(timing.schedule, AtSchedule):
        begin = timing.schedule.at
    else:
        begin = now
    return timing.next_occurrence(begin - _TINY)


def next_fire_after_completion(timing: PlanTiming, runs_made: int, run_end: datetime) -> datetime | None:
    """``after_completion``: the next fire time counted from the end of the previous run.

    ``every`` adds its interval to ``run_end`` (whole days on the local calendar, at ``run_end``'s
    local time); other kinds take their first occurrence after ``run_end``. None: the plan ended
    (repeat reached, past ``end``, or no further occurrence).
    """
    run_end = utc_ms(require_aware(run_end, "run_end"))
    if timing.repeat is not None and runs_made >= timing.repeat:
        return None
    schedule = timing.schedule
    if not isinstance(schedule, EverySchedule):
        return timing.next_occurrence(run_end)
    if schedule.local_days:
        zone = get_zone(timing.tz)
        wall = run_end.astimezone(zone).replace(tzinfo=None)
        found = utc_ms(resolve_local(wall + schedule.interval, zone))
    else:
        found = run_end + schedule.interval
    return None if timing.end is not None and found > timing.end else found


def plan_step(
    timing: PlanTiming, progress: PlanProgress, now: datetime, *, scan_limit: int = DEFAULT_SCAN_LIMIT
) -> PlanStep:
    """Decide which due occurrences to materialise now and the plan's new ``next_fire_time``.

    Pure: the caller inserts one task per fire time (key from (plan id, fire time)) and stores the
    result with a compare-and-set on ``progress.next_fire_time``. At most ``scan_limit``
    occurrences are visited; ``more_due`` then asks for another step.
    """
    now = require_aware(now, "now")
    if scan_limit < 1:
        raise InvalidInput("scan_limit must be at least 1")
    runs, skip_next = progress.runs_made, progress.skip_next
    fire = progress.next_fire_time
    remaining = None if timing.repeat is None else timing.repeat - runs

    def result(
        fires: list[datetime], next_fire: datetime | None, skipped: int, *, awaiting: bool = False
    ) -> PlanStep:
        if remaining is not None and len(fires) >= remaining:
            fires, next_fire, awaiting = fires[: max(remaining, 0)], None, False
        return PlanStep(
            fire_times=tuple(fires),
            next_fire_time=next_fire,
            skipped_cnt=skipped,
            skip_next=skip_next,
            runs_made=runs + len(fires),
            ended=next_fire is None and not awaiting,
            awaiting_completion=awaiting,
            more_due=next_fire is not None and next_fire <= now,
        )

    if fire is None or (remaining is not None and remaining <= 0):
        return result([], None, 0)
    if fire > now:
        return result([], fire, 0)

    skipped = 0
    if timing.catch_up is CatchUp.AFTER_COMPLETION:
        while fire is not None and fire <= now:
            if skip_next == 0:  # wait for the run's end, unless no occurrence could follow it
                return result([fire], None, skipped, awaiting=timing.next_occurrence(fire) is not None)
            skip_next, skipped = skip_next - 1, skipped + 1
            fire = next_fire_after_completion(timing, runs, fire)
        return result([], fire, skipped)

    late_before = now - timing.misfire_grace
    fires: list[datetime] = []
    late: deque[datetime] = deque()  # late occurrences still to decide on (run_once / run_all)
    keep_late = {CatchUp.SKIP: 0, CatchUp.RUN_ONCE: 1, CatchUp.RUN_ALL: timing.catch_up_cap}[timing.catch_up]
    scanned = 0
    occurrence: datetime | None = fire
    while occurrence is not None and occurrence <= now and scanned < scan_limit:
        if remaining is not None and len(fires) >= remaining:
            break
        scanned += 1
        if skip_next > 0:
            skip_next, skipped = skip_next - 1, skipped + 1
        elif occurrence >= late_before:
            fires.extend(late)  # the late region is over: its kept occurrences run first
            late.clear()
            fires.append(occurrence)
        else:
            late.append(occurrence)
            if len(late) > keep_late:
                late.popleft()
                skipped += 1
        occurrence = timing.next_occurrence(occurrence)
    if late and occurrence is not None and occurrence < late_before:
        # Stopped by the scan limit inside the late region: the kept ones are not decided yet.
        return result(fires, late[0], skipped)
    fires.extend(late)
    return result(fires, occurrence, skipped)


def iter_occurrences(timing: PlanTiming, after: datetime) -> Iterator[datetime]:
    """The plan's occurrences strictly after ``after`` within ``end``, oldest first (for listings)."""
    found = timing.next_occurrence(require_aware(after, "after"))
    while found is not None:
        yield found
        found = timing.next_occurrence(found)
