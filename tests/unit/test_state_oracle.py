"""``derive`` against the plain second statement of the table (``tests/oracle.py``), on random task
documents: every attempt status, the options that matter (slots, budget, targets, groups,
repeats, run_at), every mark (broken, expired, cancelled, paused) and the child-task inputs
(blocked, marked, a parent's children)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mscheduler.domain.state import DERIVED_FIELDS, derive, family_inputs
from tests.oracle import ATTEMPT_STATUSES, TASK_STATUSES, expected_derived

T0 = datetime(2030, 1, 1, tzinfo=UTC)
WORKERS = ("w0", "w1", "w2")
GROUPS = ("a", "b")

times = st.integers(-60, 60).map(lambda s: T0 + timedelta(seconds=s))


def entries(statuses: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "worker_id": st.sampled_from(WORKERS),
            "attempt": st.sampled_from(["a1", "a2", "a3"]),
            "status": st.sampled_from(statuses),
            "ping_expire_time": times,
            "retry_at": st.none() | times,
        },
        optional={"final": st.booleans()},
    )


# entries of every status; or none that uses the budget up at once (rejected, final), so that
# many documents stay claimable and the claim fields (claim_at, claimers) are exercised too; or
# a fan-out under way (who may claim it next depends on who runs it and who has succeeded)
worker_states = st.one_of(
    st.lists(entries(ATTEMPT_STATUSES), max_size=5),
    st.lists(
        entries(tuple(s for s in ATTEMPT_STATUSES if s != "rejected")).map(lambda e: e | {"final": False}),
        max_size=5,
    ),
    st.lists(entries(("running", "succeeded")), min_size=1, max_size=3),
)
options = st.fixed_dictionaries(
    {
        "priority": st.integers(-1, 3),
        "concurrent_worker_cnt": st.integers(1, 4),
        "specific_worker_ids": st.lists(st.sampled_from(WORKERS), max_size=3) | st.just(list(WORKERS)),
        "max_unexpected_retries": st.none() | st.integers(0, 3),
        "run_at": times,
        "same_worker_may_repeat": st.booleans(),
    },
    optional={
        "specific_groups": st.lists(st.sampled_from(GROUPS), max_size=2, unique=True),
        "fair_key": st.sampled_from(["acme", "globex"]),
        "aging_ms": st.sampled_from([1, 1000, 60_000]),
    },
)
MARKS: dict[str, st.SearchStrategy[Any]] = {
    "broken": st.just({"type": "DocumentTooLarge", "message": "too large"}),
    "expired_at": times,
    "cancelled": st.fixed_dictionaries({"reason": st.just("operator"), "time": times}),
    "paused": st.booleans(),
    "blocked": st.booleans(),
    "marked": st.sampled_from(TASK_STATUSES).map(lambda s: {"status": s}),
}
children = st.lists(st.sampled_from(TASK_STATUSES).map(lambda s: {"status": s}), min_size=1, max_size=4)
# most documents carry no mark or one (a mark closes the claim, hiding the rest of the table); a
# parent's status comes from its children; and now and then anything together
marks = st.one_of(
    st.just({}),
    st.sampled_from(sorted(MARKS)).flatmap(lambda mark: st.fixed_dictionaries({mark: MARKS[mark]})),
    st.fixed_dictionaries({"children": children}),
    st.fixed_dictionaries({}, optional={**MARKS, "children": children}),
)


@st.composite
def task_documents(draw: st.DrawFn) -> dict[str, Any]:
    state = {"worker_states": draw(worker_states)} | draw(marks)
    name = draw(st.sampled_from(["job", "other"]))
    return {"key": "t", "name": name, "option": draw(options), "state": state}


def derived_by_the_code(doc: dict[str, Any]) -> dict[str, Any]:
    state = doc["state"]
    return derive(
        doc["name"],
        doc["option"],
        state["worker_states"],
        state.get("broken") is not None,
        state.get("expired_at") is not None,
        state.get("cancelled") is not None,
        state.get("paused") is True,
        **family_inputs(state),
    )


@settings(max_examples=1000)
@given(task_documents())
def test_derive_agrees_with_the_design_table(doc: dict[str, Any]) -> None:
    expected = expected_derived(doc)
    assert set(expected) == set(DERIVED_FIELDS)
    assert derived_by_the_code(doc) == expected


def test_the_oracle_reads_the_table_as_written() -> None:
    """A few rows worked by hand, so that the oracle itself is pinned (not only its agreement)."""
    option = {"priority": 3, "concurrent_worker_cnt": 2, "specific_worker_ids": ["w0", "w1"], "run_at": T0}
    option |= {"max_unexpected_retries": 1, "specific_groups": ["a"]}
    later = T0 + timedelta(seconds=30)
    entry = {"worker_id": "w0", "status": "succeeded", "retry_at": None}
    failed = {"worker_id": "w1", "status": "lost", "retry_at": later}
    doc: dict[str, Any] = {"name": "job", "option": option, "state": {"worker_states": [entry, failed]}}
    assert expected_derived(doc) | {"claimers": sorted(expected_derived(doc)["claimers"])} == {
        "running_cnt": 0,
        "success_cnt": 1,
        "fail_cnt": 1,
        "rejected_cnt": 0,
        "attempt_cnt": 2,
        "retry_at": later,
        "targeted": True,
        "free_slots": 1,
        "status": "pending",
        "claim_at": later,
        "claimers": ["job|g:a", "job|w1"],
        "claim_priority": 3,
        "order_at": later,
    }
    # a fairness key in every token; aging: priority 0 for the claim, 3 x 10 s earlier in order
    doc["option"] = option | {"fair_key": "acme", "aging_ms": 10_000}
    assert sorted(expected_derived(doc)["claimers"]) == ["job#acme|g:a", "job#acme|w1"]
    assert expected_derived(doc)["claim_priority"] == 0
    assert expected_derived(doc)["order_at"] == later - timedelta(seconds=30)
    doc["option"] = option
    doc["state"]["worker_states"].append({"worker_id": "w1", "status": "failed", "retry_at": None})
    assert expected_derived(doc)["status"] == "failed"  # 2 failures > a budget of 1
    assert expected_derived(doc)["claim_at"] is None and expected_derived(doc)["claimers"] == []
    doc["state"] = {"worker_states": [], "children": [{"status": "succeeded"}, {"status": "cancelled"}]}
    assert expected_derived(doc)["status"] == "failed" and expected_derived(doc)["claim_at"] is None
