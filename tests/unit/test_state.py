"""mscheduler.domain.state.derive: the task's state from its worker entries and options (SPEC F7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler.domain.state import DERIVED_FIELDS, derive, lease_expiry

T0 = datetime(2030, 1, 1, tzinfo=UTC)
RUN_AT = T0


def _option(
    cnt: int = 1, retries: int = 3, ids: tuple[str, ...] = (), run_at: datetime = RUN_AT
) -> dict[str, Any]:
    return {
        "priority": 0,
        "concurrent_worker_cnt": cnt,
        "specific_worker_ids": list(ids),
        "ping_interval_ms": 10_000,
        "worker_timeout_ms": 30_000,
        "max_unexpected_retries": retries,
        "retry_delay_ms": 10_000,
        "run_at": run_at,
    }


def _entry(status: str, retry_in: float | None = None, expire_in: float = 30) -> dict[str, Any]:
    return {
        "worker_id": "w",
        "attempt": "a",
        "status": status,
        "ping_expire_time": T0 + timedelta(seconds=expire_in),
        "retry_at": T0 + timedelta(seconds=retry_in) if retry_in is not None else None,
    }


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# (option, entries) -> (status, running, success, fail, free_slots, claim_at)
CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], tuple[Any, ...]]] = [
    ("new", _option(), [], ("pending", 0, 0, 0, 1, RUN_AT)),
    ("running", _option(), [_entry("running")], ("running", 1, 0, 0, 0, None)),
    ("fan-out, one running", _option(cnt=2), [_entry("running")], ("running", 1, 0, 0, 1, RUN_AT)),
    ("succeeded", _option(), [_entry("succeeded")], ("succeeded", 0, 1, 0, 0, None)),
    (
        "fan-out, one done one running",
        _option(cnt=2),
        [_entry("succeeded"), _entry("running")],
        ("running", 1, 1, 0, 0, None),
    ),
    ("fan-out, one done", _option(cnt=2), [_entry("succeeded")], ("pending", 0, 1, 0, 1, RUN_AT)),
    ("failed once, retry later", _option(), [_entry("failed", retry_in=10)], ("pending", 0, 0, 1, 1, at(10))),
    (
        "failed once, run_at later than retry",
        _option(run_at=at(60)),
        [_entry("failed", retry_in=10)],
        ("pending", 0, 0, 1, 1, at(60)),
    ),
    (
        "latest failure's retry time wins",
        _option(),
        [_entry("failed", retry_in=30), _entry("lost", retry_in=5)],
        ("pending", 0, 0, 2, 1, at(30)),
    ),
    (
        "lost counts as a failure",
        _option(retries=0),
        [_entry("lost", retry_in=0)],
        ("failed", 0, 0, 1, 1, None),
    ),
    (
        "budget reached, not exceeded",
        _option(retries=2),
        [_entry("failed", 1), _entry("failed", 2)],
        ("pending", 0, 0, 2, 1, at(2)),
    ),
    (
        "budget exceeded",
        _option(retries=2),
        [_entry("failed", 1), _entry("lost", 2), _entry("failed", 3)],
        ("failed", 0, 0, 3, 1, None),
    ),
    (
        "budget exceeded while another still runs: no claim",
        _option(cnt=2, retries=0),
        [_entry("failed", 1), _entry("running")],
        ("running", 1, 0, 1, 1, None),
    ),
    (
        "budget exceeded, two free slots, still no claim",
        _option(cnt=3, retries=0),
        [_entry("failed", 1), _entry("running")],
        ("running", 1, 0, 1, 2, None),
    ),
    ("rejected fails at once", _option(retries=99), [_entry("rejected")], ("failed", 0, 0, 1, 1, None)),
    (
        "released and revoked do not count",
        _option(retries=0),
        [_entry("released", retry_in=99), _entry("revoked", retry_in=99)],
        ("pending", 0, 0, 0, 1, RUN_AT),
    ),
    (
        "success wins over a used budget",
        _option(retries=0),
        [_entry("failed", 1), _entry("succeeded")],
        ("succeeded", 0, 1, 1, 0, None),
    ),
    (
        "more successes than slots",
        _option(cnt=1),
        [_entry("succeeded"), _entry("succeeded")],
        ("succeeded", 0, 2, 0, 0, None),
    ),
]


@pytest.mark.parametrize(("option", "entries", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_derive(option: dict[str, Any], entries: list[dict[str, Any]], expected: tuple[Any, ...]) -> None:
    state = derive("job", option, entries)
    assert set(state) == set(DERIVED_FIELDS)
    got = (
        state["status"],
        state["running_cnt"],
        state["success_cnt"],
        state["fail_cnt"],
        state["free_slots"],
        state["claim_at"],
    )
    assert got == expected


def test_retry_at_comes_from_failures_only() -> None:
    entries = [
        _entry("released", retry_in=500),
        _entry("failed", retry_in=20),
        _entry("succeeded", retry_in=900),
    ]
    assert derive("job", _option(cnt=2), entries)["retry_at"] == at(20)
    assert derive("job", _option(), [_entry("released", retry_in=5)])["retry_at"] is None
    assert derive("job", _option(), [])["retry_at"] is None


def test_rejected_entries_are_counted_apart() -> None:
    state = derive("job", _option(retries=5), [_entry("failed", 1), _entry("rejected")])
    assert (state["fail_cnt"], state["rejected_cnt"], state["status"]) == (2, 1, "failed")
    assert derive("job", _option(), [_entry("failed", 1)])["rejected_cnt"] == 0


def test_targeted_follows_specific_worker_ids() -> None:
    assert derive("job", _option(ids=("w1",)), [])["targeted"] is True
    assert derive("job", _option(), [])["targeted"] is False


def test_lease_expiry_is_the_earliest_running_expiry() -> None:
    entries = [_entry("running", expire_in=40), _entry("lost", expire_in=1), _entry("running", expire_in=25)]
    assert lease_expiry(entries) == at(25)
    assert lease_expiry([_entry("succeeded")]) is None
    assert lease_expiry([]) is None
