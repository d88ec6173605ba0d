"""Retry policies produce exactly the delays documented in domain/retry.py (issue 7, SPEC F13, F25)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from fractions import Fraction
from random import Random
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.retry import (
    AnyRetryPolicy,
    ExponentialRetry,
    FixedRetry,
    FixedThenExponentialRetry,
    Jitter,
    PerDayRetry,
    RetryPolicy,
    next_retry,
    parse_retry_policy,
)

T0 = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MIN = timedelta(minutes=1)
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def delays(policy: RetryPolicy, failures: int, start: datetime = T0) -> list[timedelta | None]:
    """Each failure happens the moment its retry is due; returns the waits, None = gave up."""
    times: list[datetime] = [start]
    out: list[timedelta | None] = []
    for _ in range(failures):
        when = next_retry(policy, times, times[-1], Random(0))
        out.append(None if when is None else when - times[-1])
        if when is None:
            break
        times.append(when)
    return out


# -- the documented examples ----------------------------------------------------------------------


def test_fixed_waits_the_delay_and_the_failure_after_max_retries_is_final() -> None:
    policy = FixedRetry(delay=10 * S, max_retries=3)
    assert delays(policy, 5) == [10 * S, 10 * S, 10 * S, None]
    assert policy.retry_budget == 3 and policy.max_attempts == 4


def test_exponential_doubles_up_to_the_cap() -> None:
    policy = ExponentialRetry(base_delay=S, multiplier=2, max_delay=10 * S, max_retries=6)
    assert delays(policy, 8) == [S, 2 * S, 4 * S, 8 * S, 10 * S, 10 * S, None]
    assert policy.delay_table_ms(7) == [1000, 2000, 4000, 8000, 10000, 10000, 10000]


def test_fixed_then_exponential_starts_the_exponential_part_at_base_delay() -> None:
    policy = FixedThenExponentialRetry(
        fixed_delay=5 * S, fixed_retries=2, base_delay=MIN, multiplier=3, max_retries=5
    )
    assert delays(policy, 7) == [5 * S, 5 * S, MIN, 3 * MIN, 9 * MIN, None]


def test_per_day_example_from_the_docstring() -> None:
    policy = PerDayRetry(tries_per_day=3, days=2, delay=10 * MIN, tz="Europe/Berlin")
    monday_9 = datetime(2030, 1, 7, 9, 0, tzinfo=BERLIN)  # a Monday, CET
    times = [monday_9]
    seen = []
    while (when := next_retry(policy, times, times[-1], Random(0))) is not None:
        seen.append(when.astimezone(BERLIN).strftime("%a %H:%M"))
        times.append(when)
    assert seen == ["Mon 09:10", "Mon 09:20", "Mon 09:30", "Tue 00:00", "Tue 00:10", "Tue 00:20"]
    assert len(times) == 7 and policy.retry_budget == 6
    assert policy.delay_table_ms(8) == [600_000, 600_000, 600_000, None, 600_000, 600_000, None, 600_000]


def test_unlimited_policies_never_give_up() -> None:
    for policy in (
        FixedRetry(delay=S, max_retries=None),
        ExponentialRetry(base_delay=S, max_retries=None),
        FixedThenExponentialRetry(fixed_retries=2, max_retries=None),
        PerDayRetry(days=None),
    ):
        assert policy.retry_budget is None and policy.max_attempts is None
        failures = [T0 + k * S for k in range(10_000)]
        assert next_retry(policy, failures, failures[-1], Random(0)) is not None


def test_huge_exponents_are_capped_not_overflowed() -> None:
    policy = ExponentialRetry(base_delay=S, multiplier=1000, max_delay=timedelta(days=1), max_retries=None)
    assert policy.delay_for(1_000_000) == timedelta(days=1)
    assert ExponentialRetry(base_delay=S, multiplier=1, max_retries=None).delay_for(10**6) == S


# -- equivalence with today's retry_delay + max_unexpected_retries ----------------------------------


@settings(max_examples=150, deadline=None)
@given(
    delay_ms=st.integers(0, 10**9),
    max_unexpected_retries=st.integers(0, 20),
    gaps=st.lists(st.integers(0, 10**8), min_size=1, max_size=25),
)
def test_from_retry_delay_matches_todays_rule(
    delay_ms: int, max_unexpected_retries: int, gaps: list[int]
) -> None:
    """Today: failures beyond max_unexpected_retries fail the task; otherwise retry after the delay."""
    policy = RetryPolicy.from_retry_delay(timedelta(milliseconds=delay_ms), max_unexpected_retries)
    assert policy == FixedRetry(delay=timedelta(milliseconds=delay_ms), max_retries=max_unexpected_retries)
    times = []
    t = T0
    for gap in gaps:
        t += timedelta(milliseconds=gap)
        times.append(t)
        fail_cnt = len(times)
        got = next_retry(policy, times, t, Random(0))
        if fail_cnt > max_unexpected_retries:
            assert got is None
        else:
            assert got == t + timedelta(milliseconds=delay_ms)


# -- exact arithmetic against an independent computation ------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    base_ms=st.integers(1, 10**7),
    multiplier=st.sampled_from([1.0, 1.1, 1.5, 2.0, 2.5, 3.0, 10.0]),
    cap_factor=st.integers(1, 10**4),
    k=st.integers(1, 200),
)
def test_exponential_delay_is_base_times_multiplier_power_capped(
    base_ms: int, multiplier: float, cap_factor: int, k: int
) -> None:
    cap_ms = min(base_ms * cap_factor, 366 * 86_400_000)
    policy = ExponentialRetry(
        base_delay=timedelta(milliseconds=base_ms),
        multiplier=multiplier,
        max_delay=timedelta(milliseconds=cap_ms),
        max_retries=None,
    )
    exact = Fraction(base_ms) * Fraction(multiplier) ** (k - 1)
    got = policy.delay_for(k)
    assert got is not None
    got_ms = got // timedelta(milliseconds=1)
    if exact >= cap_ms:
        assert got_ms == cap_ms
    else:
        assert abs(got_ms - exact) <= Fraction(1, 2) + Fraction(1, 10**6)
    if k > 1:
        previous = policy.delay_for(k - 1)
        assert previous is not None and previous <= got


@settings(max_examples=150, deadline=None)
@given(fixed_retries=st.integers(1, 10), k=st.integers(1, 40), multiplier=st.sampled_from([1.0, 2.0, 1.5]))
def test_fixed_then_exponential_is_fixed_then_a_shifted_exponential(
    fixed_retries: int, k: int, multiplier: float
) -> None:
    policy = FixedThenExponentialRetry(
        fixed_delay=7 * S,
        fixed_retries=fixed_retries,
        base_delay=2 * S,
        multiplier=multiplier,
        max_delay=timedelta(hours=2),
        max_retries=None,
    )
    plain = ExponentialRetry(base_delay=2 * S, multiplier=multiplier, max_delay=timedelta(hours=2))
    expected = 7 * S if k <= fixed_retries else plain.delay_for(k - fixed_retries)
    assert policy.delay_for(k) == expected


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 6), days=st.integers(1, 5), k=st.integers(1, 40))
def test_per_day_marks_exactly_the_first_try_of_each_later_day(n: int, days: int, k: int) -> None:
    policy = PerDayRetry(tries_per_day=n, days=days, delay=MIN)
    day_boundary = k > n and (k - 1) % n == 0
    assert policy.delay_for(k) == (None if day_boundary else MIN)
    assert policy.retry_budget == n * days


# -- jitter ---------------------------------------------------------------------------------------


def test_jitter_is_exact_with_a_seeded_random() -> None:
    base = FixedRetry(delay=10 * S, max_retries=None)
    full = base.model_copy(update={"jitter": Jitter.full()})
    plus_minus = base.model_copy(update={"jitter": Jitter.plus_minus(0.25)})
    failures = [T0]
    rng, mirror = Random(42), Random(42)
    got = [next_retry(full, failures, T0, rng) for _ in range(5)]
    assert got == [T0 + timedelta(milliseconds=mirror.randint(0, 10_000)) for _ in range(5)]
    rng, mirror = Random(7), Random(7)
    got = [next_retry(plus_minus, failures, T0, rng) for _ in range(5)]
    assert got == [T0 + timedelta(milliseconds=mirror.randint(7_500, 12_500)) for _ in range(5)]
    # Pinned values: a change in how jitter draws would change the delays users see.
    rng = Random(42)
    assert [Jitter.full().apply(10_000, rng) for _ in range(3)] == [1824, 409, 4506]
    rng = Random(7)
    assert [Jitter.plus_minus(0.25).apply(10_000, rng) for _ in range(3)] == [10152, 8735, 10734]


def test_no_jitter_draws_nothing() -> None:
    rng = Random(3)
    state = rng.getstate()
    assert next_retry(FixedRetry(delay=S), [T0], T0, rng) == T0 + S
    assert rng.getstate() == state


@settings(max_examples=200, deadline=None)
@given(delay_ms=st.integers(0, 10**9), fraction=st.floats(0, 1), seed=st.integers(0, 2**32))
def test_jitter_stays_in_its_documented_range(delay_ms: int, fraction: float, seed: int) -> None:
    full = Jitter.full().apply(delay_ms, Random(seed))
    assert 0 <= full <= delay_ms
    ranged = Jitter.plus_minus(fraction).apply(delay_ms, Random(seed))
    assert round(delay_ms * (1 - fraction)) <= ranged <= round(delay_ms * (1 + fraction))
    assert Jitter().apply(delay_ms, Random(seed)) == delay_ms


def test_per_day_day_starts_are_not_jittered_but_spacing_is() -> None:
    policy = PerDayRetry(tries_per_day=1, days=3, delay=MIN, jitter=Jitter.full())
    # k = 2 with one try a day is a day boundary: midnight UTC, whatever the seed.
    monday_noon = datetime(2030, 1, 7, 12, tzinfo=UTC)
    for seed in range(5):
        got = next_retry(policy, [monday_noon, monday_noon], monday_noon, Random(seed))
        assert got == datetime(2030, 1, 8, tzinfo=UTC)
    mirror = Random(9)
    expected = monday_noon + timedelta(milliseconds=mirror.randint(0, 60_000))
    assert next_retry(policy, [monday_noon], monday_noon, Random(9)) == expected


# -- per day across DST changes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "failure_local", "day_start", "expected_local"),
    [
        # Berlin springs forward on 2030-03-31 at 02:00 -> 03:00: 02:30 does not exist.
        ("Europe/Berlin", datetime(2030, 3, 30, 18, 0), time(2, 30), "2030-03-31T03:00:00+02:00"),
        ("Europe/Berlin", datetime(2030, 3, 30, 18, 0), time(0, 0), "2030-03-31T00:00:00+01:00"),
        ("Europe/Berlin", datetime(2030, 3, 30, 18, 0), time(9, 0), "2030-03-31T09:00:00+02:00"),
        # Berlin falls back on 2030-10-27 at 03:00 -> 02:00: 02:30 happens twice, the first counts.
        ("Europe/Berlin", datetime(2030, 10, 26, 18, 0), time(2, 30), "2030-10-27T02:30:00+02:00"),
        ("Europe/Berlin", datetime(2030, 10, 26, 18, 0), time(9, 0), "2030-10-27T09:00:00+01:00"),
        # New York springs forward on 2030-03-10 at 02:00 and falls back on 2030-11-03 at 02:00.
        ("America/New_York", datetime(2030, 3, 9, 18, 0), time(2, 30), "2030-03-10T03:00:00-04:00"),
        ("America/New_York", datetime(2030, 3, 9, 18, 0), time(0, 0), "2030-03-10T00:00:00-05:00"),
        ("America/New_York", datetime(2030, 11, 2, 18, 0), time(1, 30), "2030-11-03T01:30:00-04:00"),
        ("America/New_York", datetime(2030, 11, 2, 18, 0), time(6, 0), "2030-11-03T06:00:00-05:00"),
    ],
)
def test_per_day_next_day_start_is_dst_correct(
    tz: str, failure_local: datetime, day_start: time, expected_local: str
) -> None:
    policy = PerDayRetry(tries_per_day=2, days=3, delay=MIN, tz=tz, day_start=day_start)
    failure = failure_local.replace(tzinfo=ZoneInfo(tz))
    # Three failures: the first run and day one's two retries; the next try is the next day.
    times = [failure - 2 * MIN, failure - MIN, failure]
    got = next_retry(policy, times, failure, Random(0))
    assert got is not None
    assert got == datetime.fromisoformat(expected_local)
    assert got.tzinfo == UTC


def test_per_day_counts_days_from_the_failure_that_used_the_day_so_a_late_day_pushes_on() -> None:
    policy = PerDayRetry(tries_per_day=2, days=2, delay=timedelta(hours=1), tz="America/New_York")
    late = datetime(2030, 1, 7, 23, 30, tzinfo=NEW_YORK)
    # Day one's retries run past midnight: the third failure is on Tuesday, so day two is Wednesday.
    times = [late, late + timedelta(hours=1), late + timedelta(hours=2)]
    assert next_retry(policy, times, times[-1], Random(0)) == datetime(2030, 1, 9, tzinfo=NEW_YORK)


# -- time handling --------------------------------------------------------------------------------


def test_a_retry_is_never_before_now() -> None:
    """A lost lease found late: failure at the lease's end, detected later; retry at once."""
    policy = FixedRetry(delay=10 * S)
    lease_end = T0
    now = T0 + timedelta(minutes=5)
    assert next_retry(policy, [lease_end], now, Random(0)) == now
    assert next_retry(policy, [lease_end], T0 + S, Random(0)) == T0 + 10 * S


def test_results_are_utc_and_cut_to_milliseconds() -> None:
    failure = datetime(2030, 1, 7, 9, 0, 0, 123_456, tzinfo=BERLIN)
    got = next_retry(FixedRetry(delay=S), [failure], failure, Random(0))
    assert got == datetime(2030, 1, 7, 8, 0, 1, 123_000, tzinfo=UTC) and got.tzinfo is UTC


# -- storage --------------------------------------------------------------------------------------


durations = st.integers(0, 86_400_000).map(lambda ms: timedelta(milliseconds=ms))
jitters = st.one_of(
    st.just(Jitter()),
    st.just(Jitter.full()),
    st.floats(0.01, 1).map(lambda f: Jitter.plus_minus(round(f, 3))),
)
retries = st.one_of(st.none(), st.integers(3, 1000))
policies: st.SearchStrategy[RetryPolicy] = st.one_of(
    st.builds(FixedRetry, delay=durations, max_retries=retries, jitter=jitters),
    st.builds(
        ExponentialRetry,
        base_delay=st.just(S),
        multiplier=st.sampled_from([1.0, 1.5, 2.0]),
        max_delay=durations.map(lambda d: d + S),
        max_retries=retries,
        jitter=jitters,
    ),
    st.builds(
        FixedThenExponentialRetry,
        fixed_delay=durations,
        fixed_retries=st.integers(1, 3),
        base_delay=st.just(S),
        max_retries=retries,
        jitter=jitters,
    ),
    st.builds(
        PerDayRetry,
        tries_per_day=st.integers(1, 10),
        days=st.one_of(st.none(), st.integers(1, 30)),
        delay=durations,
        tz=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
        day_start=st.times().map(lambda t: t.replace(microsecond=0)),
        jitter=jitters,
    ),
)


@settings(max_examples=150, deadline=None)
@given(policy=policies)
def test_storage_round_trips_through_json(policy: RetryPolicy) -> None:
    doc = policy.to_storage()
    assert json.loads(json.dumps(doc)) == doc  # plain JSON-like values, durations in ms
    assert not any(isinstance(v, timedelta) for v in doc.values())
    assert RetryPolicy.from_storage(json.loads(json.dumps(doc))) == policy


def test_storage_shape_is_documented_ms() -> None:
    policy = PerDayRetry(tries_per_day=2, days=3, delay=MIN, tz="Europe/Berlin", day_start=time(8, 30))
    assert policy.to_storage() == {
        "kind": "per_day",
        "jitter": {"kind": "none", "fraction": 0.0},
        "tries_per_day": 2,
        "days": 3,
        "delay_ms": 60_000,
        "tz": "Europe/Berlin",
        "day_start": "08:30:00",
    }
    assert FixedRetry.from_storage({"kind": "fixed", "delay_ms": 2500, "max_retries": None}) == FixedRetry(
        delay=timedelta(milliseconds=2500), max_retries=None
    )


def test_sub_millisecond_durations_are_cut_to_what_storage_keeps() -> None:
    assert FixedRetry(delay=timedelta(microseconds=1_500)).delay == timedelta(milliseconds=1)


# -- validation -----------------------------------------------------------------------------------

INVALID: list[tuple[dict[str, Any], str]] = [
    ({"kind": "fixed", "delay": timedelta(seconds=-1)}, "fixed.delay"),
    ({"kind": "fixed", "delay": timedelta(days=400)}, "fixed.delay"),
    ({"kind": "fixed", "max_retries": -1}, "fixed.max_retries"),
    ({"kind": "fixed", "max_retries": 10**7}, "fixed.max_retries"),
    ({"kind": "fixed", "retry_delay": S}, "fixed.retry_delay"),
    ({"kind": "exponential", "multiplier": 0.5}, "exponential.multiplier"),
    ({"kind": "exponential", "multiplier": float("nan")}, "exponential.multiplier"),
    ({"kind": "exponential", "multiplier": 10_000}, "exponential.multiplier"),
    ({"kind": "exponential", "base_delay": timedelta(0)}, "exponential.base_delay"),
    ({"kind": "exponential", "base_delay": 10 * S, "max_delay": S}, "exponential.max_delay"),
    ({"kind": "fixed_then_exponential", "fixed_retries": 5, "max_retries": 2}, "fixed_retries"),
    ({"kind": "fixed_then_exponential", "fixed_retries": 0}, "fixed_retries"),
    ({"kind": "per_day", "tz": "Mars/Olympus_Mons"}, "per_day.tz"),
    ({"kind": "per_day", "tz": "../../etc/passwd"}, "per_day.tz"),
    ({"kind": "per_day", "tries_per_day": 0}, "per_day.tries_per_day"),
    ({"kind": "per_day", "days": 0}, "per_day.days"),
    ({"kind": "per_day", "day_start": time(8, tzinfo=UTC)}, "per_day.day_start"),
    ({"kind": "fixed", "jitter": {"kind": "fraction", "fraction": 1.5}}, "fixed.jitter.fraction"),
    ({"kind": "fixed", "jitter": {"kind": "full", "fraction": 0.5}}, "fixed.jitter.fraction"),
    ({"kind": "fixed", "jitter": {"kind": "gaussian"}}, "fixed.jitter.kind"),
    ({"kind": "linear"}, "kind"),
    ({}, "kind"),
]


@pytest.mark.parametrize(("data", "field"), INVALID)
def test_bad_policies_raise_invalid_input_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        parse_retry_policy(data)


def test_direct_construction_raises_invalid_input_too() -> None:
    with pytest.raises(InvalidInput, match=r"multiplier"):
        ExponentialRetry(multiplier=0.9)
    with pytest.raises(InvalidInput, match=r"tz: unknown time zone"):
        PerDayRetry(tz="Nowhere/City")
    with pytest.raises(InvalidInput, match=r"fraction"):
        Jitter.plus_minus(-0.1)


def test_bad_calls_raise_invalid_input() -> None:
    policy: AnyRetryPolicy = FixedRetry()
    with pytest.raises(InvalidInput, match="failure_times"):
        next_retry(policy, [], T0, Random(0))
    with pytest.raises(InvalidInput, match="now"):
        next_retry(policy, [T0], T0.replace(tzinfo=None), Random(0))
    with pytest.raises(InvalidInput, match="failure_times"):
        next_retry(policy, [T0.replace(tzinfo=None)], T0, Random(0))
    with pytest.raises(InvalidInput, match="oldest first"):
        next_retry(policy, [T0, T0 - S], T0, Random(0))
    with pytest.raises(InvalidInput, match="k must be"):
        policy.delay_for(0)
    with pytest.raises(InvalidInput, match="limit"):
        policy.delay_table_ms(-1)


def test_policies_are_frozen_values() -> None:
    policy = FixedRetry()
    with pytest.raises(Exception, match="frozen"):
        policy.delay = S  # type: ignore[misc]
    assert parse_retry_policy(policy) is policy
    assert hash(policy) == hash(FixedRetry())
