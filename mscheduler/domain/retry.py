"""Retry policies as values: how long a task waits after a counted failure, and when it gives up.

Pure logic (no I/O, no asyncio, no storage): the consumer, the lease-expiry pass and the planner
call it with the failures so far and an injected ``now`` and ``random.Random``, so the same inputs
always give the same answer and tests are exact with a seed.

A counted failure is a failed attempt or a lost lease (a released or revoked attempt does not
count). ``k`` below is the number of counted failures so far, including the one that just
happened (k = 1 after the first run failed). The task is retried after failure ``k`` while
``k <= retry_budget`` (``max_retries``; None = unlimited) and fails for good when
``k > retry_budget``: the same rule as today's ``fail_cnt > max_unexpected_retries``.

Delay after the k-th counted failure (before jitter; durations are whole milliseconds)
----------------------------------------------------------------------------------------

========================== ====================================================== =================
kind                       delay after failure k                                   retry_budget
========================== ====================================================== =================
``fixed``                  ``delay``                                               ``max_retries``
``exponential``            ``min(max_delay, base_delay * multiplier ** (k-1))``    ``max_retries``
``fixed_then_exponential`` ``fixed_delay`` for k <= ``fixed_retries``, then        ``max_retries``
                           ``min(max_delay, base_delay * multiplier **
                           (k-1-fixed_retries))``
``per_day``                n = ``tries_per_day``: ``delay`` when k <= n or         ``n * days``
                           (k-1) % n != 0; otherwise (a day's n tries are used)
                           the next try is at ``day_start`` local time on the
                           local day after failure k, in ``tz``
========================== ====================================================== =================

Exponential delays are rounded to the nearest millisecond. Examples (k = 1, 2, 3, …):

* ``fixed(delay=10 s, max_retries=3)``: 10 s, 10 s, 10 s; the 4th failure is final.
* ``exponential(base_delay=1 s, multiplier=2, max_delay=10 s, max_retries=6)``:
  1 s, 2 s, 4 s, 8 s, 10 s, 10 s; the 7th failure is final.
* ``fixed_then_exponential(fixed_delay=5 s, fixed_retries=2, base_delay=1 min, multiplier=3,
  max_retries=5)``: 5 s, 5 s, 1 min, 3 min, 9 min; the 6th failure is final.
* ``per_day(tries_per_day=3, days=2, delay=10 min, tz="Europe/Berlin")`` with the first failure at
  Mon 09:00 local: retries Mon 09:10, 09:20, 09:30 (if each fails at once), then Tue 00:00
  local, Tue 00:10, 00:20; the 7th failure is final. The retries of day 1 are the n tries after
  the first failure (the original run is not one of them); a later "day" begins at the local day
  after the failure that used the previous day's tries, so a day's tries that run past midnight
  push the next day on. A ``day_start`` that does not exist that day (DST) is the next valid
  instant; an ambiguous one is its first instant.
* ``retry_budget`` None (``max_retries=None``, ``days=None``): retries forever on the same rule.

Jitter (``Jitter``) turns a delay ``d`` (ms) into: ``none`` → ``d``; ``full`` →
``rng.randint(0, d)``; ``fraction`` f → ``rng.randint(round(d*(1-f)), round(d*(1+f)))``. It
applies to delays, not to ``per_day``'s day starts (a wall-clock time, not a delay).
``next_retry`` never returns a time before ``now``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime, time, timedelta
from random import Random
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, ValidationInfo, field_validator

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.schedule import (
    FrozenModel,
    LocalTime,
    check_zone_name,
    from_storage_dict,
    get_zone,
    invalid_input,
    require_aware,
    resolve_local,
    to_storage_dict,
    truncate_interval,
    utc_ms,
)

MAX_DELAY = timedelta(days=366)
MAX_RETRIES = 1_000_000
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_DELAY = timedelta(hours=1)
_ONE_DAY = timedelta(days=1)
_MS = timedelta(milliseconds=1)


def _check_delay(value: timedelta) -> timedelta:
    if value < timedelta(0) or value > MAX_DELAY:
        raise ValueError("must be between 0 and 366 days")
    return truncate_interval(value)


Delay = Annotated[timedelta, AfterValidator(_check_delay)]
RetryCount = Annotated[int, Field(ge=0, le=MAX_RETRIES)]


class Jitter(FrozenModel):
    """Randomness added to a delay: none, full (``[0, d]``) or +-fraction (``[d(1-f), d(1+f)]``)."""

    what: ClassVar[str] = "jitter"

    kind: Literal["none", "full", "fraction"] = "none"
    fraction: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("fraction")
    @classmethod
    def _check_fraction(cls, value: float, info: ValidationInfo) -> float:
        if value and info.data.get("kind") != "fraction":
            raise ValueError("a fraction is only meaningful with kind 'fraction'")
        return value

    @classmethod
    def full(cls) -> Jitter:
        """Uniform in [0, delay] ("full jitter")."""
        return cls(kind="full")

    @classmethod
    def plus_minus(cls, fraction: float) -> Jitter:
        """Uniform in [delay * (1 - fraction), delay * (1 + fraction)]."""
        return cls(kind="fraction", fraction=fraction)

    def apply(self, delay_ms: int, rng: Random) -> int:
        """The jittered delay in ms, drawn from ``rng`` (one ``randint`` call unless kind is none)."""
        if self.kind == "full":
            return rng.randint(0, delay_ms)
        if self.kind == "fraction":
            return rng.randint(round(delay_ms * (1 - self.fraction)), round(delay_ms * (1 + self.fraction)))
        return delay_ms


class RetryPolicy(FrozenModel):
    """How a task is retried. Use one of the kinds below; ``AnyRetryPolicy`` is their union."""

    what: ClassVar[str] = "retry policy"

    jitter: Jitter = Jitter()

    @property
    def retry_budget(self) -> int | None:
        """Counted failures tolerated: the task fails for good at failure ``retry_budget + 1``."""
        raise NotImplementedError

    @property
    def max_attempts(self) -> int | None:
        """Runs a task may get (``retry_budget + 1``); None = unlimited. For ``TaskInfo``."""
        budget = self.retry_budget
        return None if budget is None else budget + 1

    def delay_for(self, k: int) -> timedelta | None:
        """The delay after the k-th counted failure, without jitter and ignoring the budget.

        None: the retry is at a wall-clock time, not after a delay (``per_day``'s day starts);
        ``next_retry`` computes it.
        """
        if not isinstance(k, int) or k < 1:
            raise InvalidInput(f"k must be a failure count of at least 1, got {k!r}")
        return self._delay_for(k)

    def _delay_for(self, k: int) -> timedelta | None:
        raise NotImplementedError

    def delay_table_ms(self, limit: int) -> list[int | None]:
        """``delay_for(k)`` in ms for k = 1..limit: a table for a storage-side pass (None as above)."""
        if not isinstance(limit, int) or not 0 <= limit <= MAX_RETRIES:
            raise InvalidInput(f"limit must be 0..{MAX_RETRIES}, got {limit!r}")
        return [None if d is None else d // _MS for d in (self._delay_for(k) for k in range(1, limit + 1))]

    def next_retry(self, failure_times: Sequence[datetime], now: datetime, rng: Random) -> datetime | None:
        """When to retry after these counted failures (oldest first); None = give up (budget used)."""
        return next_retry(self, failure_times, now, rng)

    def _wall_clock_retry(self, last_failure: datetime) -> datetime:
        raise NotImplementedError

    def to_storage(self) -> dict[str, Any]:
        """Plain JSON-like values for storage (durations as ``<name>_ms``)."""
        return to_storage_dict(self)

    @staticmethod
    def from_storage(doc: Mapping[str, Any]) -> AnyRetryPolicy:
        """A policy from ``to_storage``'s output (or user JSON); bad input raises InvalidInput."""
        return parse_retry_policy(from_storage_dict(doc))

    @staticmethod
    def from_retry_delay(delay: timedelta, max_unexpected_retries: int) -> FixedRetry:
        """Today's ``retry_delay`` + ``max_unexpected_retries`` as a policy."""
        return FixedRetry(delay=delay, max_retries=max_unexpected_retries)


class FixedRetry(RetryPolicy):
    """``delay`` after every counted failure, ``max_retries`` times (None = unlimited)."""

    kind: Literal["fixed"] = "fixed"
    delay: Delay = timedelta(seconds=10)
    max_retries: RetryCount | None = DEFAULT_MAX_RETRIES

    @property
    def retry_budget(self) -> int | None:
        return self.max_retries

    def _delay_for(self, k: int) -> timedelta:
        return self.delay


def _exponential(base: timedelta, multiplier: float, cap: timedelta, exponent: int) -> timedelta:
    base_ms, cap_ms = base // _MS, cap // _MS
    try:
        value = base_ms * multiplier**exponent
    except OverflowError:
        return cap
    return cap if value >= cap_ms else timedelta(milliseconds=round(value))


class _Exponential(RetryPolicy):
    base_delay: Delay = timedelta(seconds=1)
    multiplier: float = Field(2.0, ge=1.0, le=1000.0, allow_inf_nan=False)
    max_delay: Delay = DEFAULT_MAX_DELAY
    max_retries: RetryCount | None = DEFAULT_MAX_RETRIES

    @field_validator("base_delay")
    @classmethod
    def _check_base(cls, value: timedelta) -> timedelta:
        if value < _MS:
            raise ValueError("must be at least 1 millisecond")
        return value

    @field_validator("max_delay")
    @classmethod
    def _check_cap(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        base = info.data.get("base_delay")
        if base is not None and value < base:
            raise ValueError(f"must be at least base_delay ({base})")
        return value

    @property
    def retry_budget(self) -> int | None:
        return self.max_retries


class ExponentialRetry(_Exponential):
    """``min(max_delay, base_delay * multiplier ** (k-1))`` after failure k, ``max_retries`` times."""

    kind: Literal["exponential"] = "exponential"

    def _delay_for(self, k: int) -> timedelta:
        return _exponential(self.base_delay, self.multiplier, self.max_delay, k - 1)


class FixedThenExponentialRetry(_Exponential):
    """``fixed_delay`` for the first ``fixed_retries`` retries, then exponential from ``base_delay``."""

    kind: Literal["fixed_then_exponential"] = "fixed_then_exponential"
    fixed_delay: Delay = timedelta(seconds=10)
    fixed_retries: int = Field(3, ge=1, le=MAX_RETRIES)

    @field_validator("fixed_retries")
    @classmethod
    def _check_fixed(cls, value: int, info: ValidationInfo) -> int:
        total = info.data.get("max_retries")  # declared in the base class, so validated first
        if total is not None and value > total:
            raise ValueError(f"must not exceed max_retries ({total}), the total number of retries")
        return value

    def _delay_for(self, k: int) -> timedelta:
        if k <= self.fixed_retries:
            return self.fixed_delay
        return _exponential(self.base_delay, self.multiplier, self.max_delay, k - 1 - self.fixed_retries)


class PerDayRetry(RetryPolicy):
    """``tries_per_day`` retries a day, ``delay`` apart, for ``days`` local days in ``tz``."""

    kind: Literal["per_day"] = "per_day"
    tries_per_day: int = Field(3, ge=1, le=10_000)
    days: int | None = Field(2, ge=1, le=3660, description="None = every day, forever")
    delay: Delay = timedelta(minutes=10)
    tz: str = "UTC"
    day_start: LocalTime = time(0, 0)

    @field_validator("tz")
    @classmethod
    def _check_tz(cls, value: str) -> str:
        return check_zone_name(value)

    @property
    def retry_budget(self) -> int | None:
        return None if self.days is None else self.tries_per_day * self.days

    def _delay_for(self, k: int) -> timedelta | None:
        if k > self.tries_per_day and (k - 1) % self.tries_per_day == 0:
            return None
        return self.delay

    def _wall_clock_retry(self, last_failure: datetime) -> datetime:
        zone = get_zone(self.tz)
        next_day = last_failure.astimezone(zone).date() + _ONE_DAY
        return resolve_local(datetime.combine(next_day, self.day_start), zone)


AnyRetryPolicy = Annotated[
    FixedRetry | ExponentialRetry | FixedThenExponentialRetry | PerDayRetry,
    Field(discriminator="kind"),
]
_POLICY_ADAPTER: TypeAdapter[AnyRetryPolicy] = TypeAdapter(AnyRetryPolicy)


def parse_retry_policy(data: Mapping[str, Any] | RetryPolicy) -> AnyRetryPolicy:
    """A policy from a mapping with a ``kind`` (bad input raises InvalidInput naming the field)."""
    if isinstance(data, FixedRetry | ExponentialRetry | FixedThenExponentialRetry | PerDayRetry):
        return data
    try:
        return _POLICY_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise invalid_input("retry policy", exc) from exc


def next_retry(
    policy: RetryPolicy, failure_times: Sequence[datetime], now: datetime, rng: Random
) -> datetime | None:
    """When to retry, given the counted failures so far (oldest first, the newest just happened).

    None means give up: the budget is used. The time is aware UTC, cut to milliseconds, and never
    before ``now``. Jitter draws from ``rng`` only (one ``randint`` per call when jitter is on).
    """
    now = require_aware(now, "now")
    if not failure_times:
        raise InvalidInput("failure_times must hold at least the failure that just happened")
    times = [require_aware(t, "failure_times") for t in failure_times]
    if any(later < earlier for earlier, later in itertools.pairwise(times)):
        raise InvalidInput("failure_times must be oldest first")
    k, last = len(times), times[-1]
    budget = policy.retry_budget
    if budget is not None and k > budget:
        return None
    delay = policy.delay_for(k)
    if delay is None:
        when = policy._wall_clock_retry(last)
    else:
        when = last + timedelta(milliseconds=policy.jitter.apply(delay // _MS, rng))
    return utc_ms(max(when, now))
