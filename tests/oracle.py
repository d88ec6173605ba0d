"""A second statement of the derived task state, written from docs/design.md, not from the code.

``mscheduler.domain.state.derive`` is the one definition the drivers use: the memory driver calls
it, the Mongo driver writes it as update-pipeline stages. A check that compares a stored document
with ``derive`` therefore compares the memory driver with itself. This module restates the same
table deliberately plainly — one small function per field, each read straight off the document
("The task document", "Task control", "Child tasks" in docs/design.md) — so that the tests have
something independent to compare both with. ``tests/unit/test_state_oracle.py`` checks that the
two statements agree on random task documents; the conformance suite's ``assert_derived`` and
the model-based tests compare the stores with this one.

Nothing here imports from ``mscheduler``: the statuses are spelled out as strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

# attempt statuses (an entry of state.worker_states)
ATTEMPT_STATUSES = (
    "running",
    "succeeded",
    "failed",
    "lost",
    "released",
    "revoked",
    "rejected",
    "snoozed",
    "cancelled",
)
# the entries that count against the retry budget
COUNTED_AS_FAILURE = ("failed", "lost", "rejected")
# task statuses
TASK_STATUSES = ("pending", "running", "succeeded", "failed", "expired", "cancelled")
# a child that ended without success makes its parent fail (once none runs)
ENDED_WITHOUT_SUCCESS = ("failed", "expired", "cancelled")

Entry = Mapping[str, Any]


def count(entries: Sequence[Entry], *statuses: str) -> int:
    n = 0
    for entry in entries:
        if entry["status"] in statuses:
            n += 1
    return n


def budget_used(option: Mapping[str, Any], entries: Sequence[Entry], broken: bool) -> bool:
    """The retry budget is used: more failures than ``max_unexpected_retries`` (null: no limit),
    or any rejected entry, or a failure the handler declared final, or a document that could not
    be written (``state.broken``)."""
    if broken:
        return True
    limit = option.get("max_unexpected_retries")
    if limit is not None and count(entries, *COUNTED_AS_FAILURE) > limit:
        return True
    if count(entries, "rejected") > 0:
        return True
    for entry in entries:
        if entry["status"] in COUNTED_AS_FAILURE and entry.get("final") is True:
            return True
    return False


def latest_retry_at(entries: Sequence[Entry]) -> datetime | None:
    """The latest ``retry_at`` of an entry that failed (failed, lost, rejected) or was snoozed."""
    times = [
        entry["retry_at"]
        for entry in entries
        if entry["status"] in (*COUNTED_AS_FAILURE, "snoozed") and entry.get("retry_at") is not None
    ]
    if not times:
        return None
    latest: datetime = max(times)
    return latest


def parent_status(children: Sequence[str]) -> str:
    """A parent's status from its children's: succeeded when every child has; running while one
    runs; failed when one ended without success and none runs; else pending."""
    if all(child == "succeeded" for child in children):
        return "succeeded"
    if "running" in children:
        return "running"
    if any(child in ENDED_WITHOUT_SUCCESS for child in children):
        return "failed"
    return "pending"


def task_status(doc: Mapping[str, Any]) -> str:
    """An operator's mark wins; then a cancel; a parent follows its children; then: succeeded
    once there are ``concurrent_worker_cnt`` successes; failed when the budget is used and
    nothing runs; expired when the deadline passed before it started and nothing runs; running
    while an entry runs; else pending."""
    state = doc["state"]
    entries = state["worker_states"]
    if state.get("marked"):
        return str(state["marked"]["status"])
    if state.get("cancelled") is not None:
        return "cancelled"
    if state.get("children") is not None:
        return parent_status([child["status"] for child in state["children"]])
    nothing_runs = count(entries, "running") == 0
    if count(entries, "succeeded") >= doc["option"]["concurrent_worker_cnt"]:
        return "succeeded"
    if budget_used(doc["option"], entries, state.get("broken") is not None) and nothing_runs:
        return "failed"
    if state.get("expired_at") is not None and nothing_runs:
        return "expired"
    if not nothing_runs:
        return "running"
    return "pending"


def free_slots(doc: Mapping[str, Any]) -> int:
    entries = doc["state"]["worker_states"]
    free = doc["option"]["concurrent_worker_cnt"] - count(entries, "running") - count(entries, "succeeded")
    return max(int(free), 0)


def claim_at(doc: Mapping[str, Any]) -> datetime | None:
    """When a free slot may be claimed: the later of ``run_at`` and the retry time; null when no
    slot is free, when it has enough successes, when its budget is used, when it expired, was
    cancelled or is paused, when it waits for a sibling (``blocked``), when an operator marked
    it, and for a parent (never claimed itself)."""
    state, option = doc["state"], doc["option"]
    entries = state["worker_states"]
    closed = (
        free_slots(doc) == 0
        or count(entries, "succeeded") >= option["concurrent_worker_cnt"]
        or budget_used(option, entries, state.get("broken") is not None)
        or state.get("expired_at") is not None
        or state.get("cancelled") is not None
        or state.get("paused") is True
        or state.get("blocked") is True
        or bool(state.get("marked"))
        or state.get("children") is not None
    )
    if closed:
        return None
    retry = latest_retry_at(entries)
    if retry is not None and retry > option["run_at"]:
        return retry
    return option["run_at"]  # type: ignore[no-any-return]


def is_targeted(option: Mapping[str, Any]) -> bool:
    return len(option["specific_worker_ids"]) > 0 or len(option.get("specific_groups") or []) > 0


def claimers(doc: Mapping[str, Any]) -> list[str]:
    """Who may claim it now: ``name|worker`` for each named worker holding no running entry and
    (unless ``same_worker_may_repeat``) no succeeded one, ``name|g:group`` for each named group,
    ``name|*`` for a task that names nobody; nobody while ``claim_at`` is null. A task with a
    fairness key ``k`` (``option.fair_key``) has ``name#k`` in place of ``name`` in each."""
    if claim_at(doc) is None:
        return []
    option, name = doc["option"], doc["name"]
    if option.get("fair_key") is not None:
        name = f"{name}#{option['fair_key']}"
    if not is_targeted(option):
        return [f"{name}|*"]
    entries = doc["state"]["worker_states"]
    repeat = option.get("same_worker_may_repeat") is True
    tokens = []
    for worker in option["specific_worker_ids"]:
        running_here = any(e["worker_id"] == worker and e["status"] == "running" for e in entries)
        succeeded_here = any(e["worker_id"] == worker and e["status"] == "succeeded" for e in entries)
        if running_here or (succeeded_here and not repeat):
            continue
        tokens.append(f"{name}|{worker}")
    for group in option.get("specific_groups") or []:
        tokens.append(f"{name}|g:{group}")
    return tokens


def expected_derived(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Every derived field of a stored task document, as the design states it."""
    entries = doc["state"]["worker_states"]
    running = count(entries, "running")
    succeeded = count(entries, "succeeded")
    failures = count(entries, *COUNTED_AS_FAILURE)
    return {
        "running_cnt": running,
        "success_cnt": succeeded,
        "fail_cnt": failures,
        "rejected_cnt": count(entries, "rejected"),
        "attempt_cnt": running + succeeded + failures,
        "retry_at": latest_retry_at(entries),
        "targeted": is_targeted(doc["option"]),
        "free_slots": free_slots(doc),
        "status": task_status(doc),
        "claim_at": claim_at(doc),
        "claimers": claimers(doc),
        "claim_priority": claim_priority(doc),
        "order_at": order_at(doc),
    }


def claim_priority(doc: Mapping[str, Any]) -> int:
    """The priority a claim orders by: the task's own, or 0 when it ages (``option.aging_ms``)."""
    option = doc["option"]
    return 0 if option.get("aging_ms") else int(option["priority"])


def order_at(doc: Mapping[str, Any]) -> datetime | None:
    """The time a claim orders by within one claim priority: ``claim_at``, moved earlier by
    ``priority`` steps of ``aging_ms`` for a task that ages; null while ``claim_at`` is."""
    due = claim_at(doc)
    option = doc["option"]
    if due is None or not option.get("aging_ms"):
        return due
    return due - timedelta(milliseconds=option["aging_ms"] * option["priority"])


def may_claim(doc: Mapping[str, Any], worker_id: str, worker_groups: Sequence[str], now: datetime) -> bool:
    """Whether a claim by ``worker_id`` (a member of ``worker_groups``) at ``now`` may take this
    task: it is due (``claim_at`` ≤ now), it names the worker, one of its groups or nobody, and
    the worker holds no running entry of it (nor a succeeded one, unless
    ``same_worker_may_repeat``): a group token does not say who ran the task."""
    due = claim_at(doc)
    if due is None or due > now:
        return False
    option = doc["option"]
    groups = option.get("specific_groups") or []
    if is_targeted(option) and worker_id not in option["specific_worker_ids"]:
        if not set(groups) & set(worker_groups):
            return False
    barred = ("running",) if option.get("same_worker_may_repeat") is True else ("running", "succeeded")
    entries = doc["state"]["worker_states"]
    return not any(e["worker_id"] == worker_id and e["status"] in barred for e in entries)
