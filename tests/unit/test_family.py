"""The rules of child tasks that need no store: a parent's status from its children's, and what a
sync does (``mscheduler.domain.state.family_status``, ``mscheduler.domain.family.plan_sync``)."""

from __future__ import annotations

from typing import Any

import pytest

from mscheduler.domain.family import plan_sync
from mscheduler.domain.state import family_status


@pytest.mark.parametrize(
    ("children", "expected"),
    [
        (["succeeded", "succeeded"], "succeeded"),
        (["succeeded", "running", "failed"], "running"),  # a failed child waits for its siblings
        (["succeeded", "failed", "pending"], "failed"),
        (["cancelled", "pending"], "failed"),
        (["expired"], "failed"),
        (["succeeded", "pending"], "pending"),
        (["pending", "pending"], "pending"),
    ],
)
def test_family_status(children: list[str], expected: str) -> None:
    assert family_status(children) == expected


def _parent(mode: str, cancelled: bool = False) -> dict[str, Any]:
    keys = ["p/a", "p/b", "p/c"]
    state = {"cancelled": {"reason": "", "time": None} if cancelled else None}
    return {"key": "p", "children": {"mode": mode, "names": ["a", "b", "c"], "keys": keys}, "state": state}


def _child(status: str, blocked: bool = False) -> dict[str, Any]:
    return {"state": {"status": status, "blocked": blocked}}


def test_plan_sync_unblocks_only_the_first_child_that_has_not_succeeded() -> None:
    children = {"p/a": _child("succeeded"), "p/b": _child("pending", True), "p/c": _child("pending", True)}
    plan = plan_sync(_parent("sequential"), children)
    assert [c["status"] for c in plan.summary] == ["succeeded", "pending", "pending"]
    assert plan.unblock == ["p/b"]
    assert plan_sync(_parent("sequential", cancelled=True), children).unblock == []
    assert plan_sync(_parent("parallel"), children).unblock == []


def test_plan_sync_counts_a_child_not_inserted_yet_as_pending() -> None:
    plan = plan_sync(_parent("sequential"), {"p/a": _child("running")})
    assert [c["status"] for c in plan.summary] == ["running", "pending", "pending"]
    assert plan.unblock == []
