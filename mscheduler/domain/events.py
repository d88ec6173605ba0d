"""What an event document is (SPEC F34): its kinds, its stored form and its id rules.

Shared by both drivers (which record the events a store-level write causes: ``sent``,
``expired``, ``lease_lost`` of a lease pass, the operators' controls, ``edited``) and by
``mscheduler.services.events`` (the consumer's buffered ``claimed`` and outcome events, the read side).
It imports nothing from the drivers, so every module may import it.

Ids are deterministic wherever one event may be written twice (a retried insert whose reply
was lost; two consumers' lease passes marking the same entry): the same event gets the same
``_id``, and a duplicate-key insert is ignored, so it is stored once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from mscheduler.domain.plans import plan_of_key

DEFAULT_RETENTION = timedelta(days=7)
DEFAULT_MAX_EVENTS = 100_000  # the memory driver's cap (newest kept)
DETAIL_MAX_CHARS = 300  # a string in ``detail`` is cut to this
DETAIL_MAX_ITEMS = 8


class EventKind(StrEnum):
    """What happened to a task."""

    SENT = "sent"  # created by a publisher (or a planner), or reset by a re-send
    CLAIMED = "claimed"  # a worker took an attempt
    SUCCEEDED = "succeeded"  # an attempt succeeded
    RETRIED = "retried"  # an attempt failed; the task will be tried again (detail: retry_at)
    FAILED = "failed"  # an attempt failed and the task failed for good (budget used, or Fail)
    REJECTED = "rejected"  # invalid params or an unstorable result: failed for good
    SNOOZED = "snoozed"  # the handler asked to run again later (not counted)
    RELEASED = "released"  # a stopping worker gave the attempt back (not counted)
    REVOKED = "revoked"  # the worker was removed from specific_worker_ids while running
    LEASE_LOST = "lease_lost"  # the attempt's lease expired (crash, stall) or its ping found it gone
    EXPIRED = "expired"  # the deadline passed before the task started
    CANCELLED = "cancelled"
    PAUSED = "paused"
    RESUMED = "resumed"
    RESTARTED = "restarted"
    REMOVED = "removed"
    EDITED = "edited"  # options changed (Operations.edit, Publisher.update_option)


# Where an event stands among a task's events of the same millisecond (``step``, with the
# attempt number): sent before a claim, a claim before its attempt's end.
_RANK = {EventKind.SENT: 0, EventKind.CLAIMED: 2, EventKind.LEASE_LOST: 4}
_TASK_LEVEL_RANK = 1  # controls, edits, expiry
_OUTCOME_RANK = 3


def event_step(kind: EventKind, attempt: int | None) -> int:
    """The order of a task's events of one time: ``attempt * 8 + rank`` (sent, controls, claimed,
    outcome, lease_lost), so a list sorted by ``(time, step, id)`` tells the story in order."""
    if kind in _RANK:
        rank = _RANK[kind]
    elif attempt is None:
        rank = _TASK_LEVEL_RANK
    else:
        rank = _OUTCOME_RANK
    return (attempt or 0) * 8 + rank


# A task control's action -> the event it records.
CONTROL_KINDS = {
    "cancel": EventKind.CANCELLED,
    "pause": EventKind.PAUSED,
    "resume": EventKind.RESUMED,
    "restart": EventKind.RESTARTED,
    "remove": EventKind.REMOVED,
}


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def attempt_event_id(key: str, attempt: str, kind: EventKind) -> str:
    """An attempt's event (claimed, an outcome, lease_lost): once per attempt token and kind."""
    return f"{key}|{attempt}|{kind.value}"


def task_event_id(key: str, kind: EventKind, when: datetime) -> str:
    """A task-level event (sent, a control, edited, expired) at ``when`` (for ``expired``, the
    deadline: the same whoever's pass marks it)."""
    return f"{key}|{kind.value}|{_ms(when)}"


def short(value: Any) -> Any:
    """A value as ``detail`` holds it: scalars and datetimes; strings cut to DETAIL_MAX_CHARS."""
    if isinstance(value, str):
        return value if len(value) <= DETAIL_MAX_CHARS else value[: DETAIL_MAX_CHARS - 3] + "..."
    if value is None or isinstance(value, (bool, int, float, datetime)):
        return value
    return short(str(value))


def error_detail(error: Mapping[str, Any] | None) -> str | None:
    """``Type: message`` of an attempt's error, short."""
    if not error:
        return None
    return str(short(f"{error.get('type')}: {error.get('message')}"))


def event_doc(
    kind: EventKind,
    key: str,
    name: str,
    time: datetime,
    *,
    event_id: str,
    worker_id: str | None = None,
    attempt: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An event's stored form (``written`` is set by the driver when it inserts it)."""
    items = [(str(k), short(v)) for k, v in detail.items() if v is not None] if detail else []
    if time.tzinfo is not UTC:
        time = time.astimezone(UTC) if time.tzinfo else time.replace(tzinfo=UTC)
    return {
        "id": event_id,
        "kind": kind.value,
        "key": key,
        "name": name,
        "plan_id": plan_of_key(key),
        "worker_id": worker_id,
        "attempt": attempt,
        "step": event_step(kind, attempt),
        "time": time,
        "detail": dict(items[:DETAIL_MAX_ITEMS]),
    }


def lost_lease_event(
    key: str, name: str, entry: Mapping[str, Any], attempt_no: int, now: datetime, by: str
) -> dict[str, Any]:
    """``lease_lost`` of one worker entry (its attempt token makes the id): written by a lease
    pass (``by="lease pass"``) and by the worker whose ping found the lease gone (``"ping"``);
    whichever lands first is kept."""
    return event_doc(
        EventKind.LEASE_LOST,
        key,
        name,
        now,
        event_id=attempt_event_id(key, entry["attempt"], EventKind.LEASE_LOST),
        worker_id=entry.get("worker_id"),
        attempt=attempt_no,
        detail={"by": by, "lease_end": entry.get("ping_expire_time")},
    )


def expired_event(key: str, name: str, deadline: datetime, now: datetime) -> dict[str, Any]:
    return event_doc(
        EventKind.EXPIRED,
        key,
        name,
        now,
        event_id=task_event_id(key, EventKind.EXPIRED, deadline),
        detail={"deadline": deadline},
    )


def task_event(
    kind: EventKind, key: str, name: str, now: datetime, detail: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """sent, a control or edited: one event at ``now``."""
    return event_doc(kind, key, name, now, event_id=task_event_id(key, kind, now), detail=detail)


def matches(doc: Mapping[str, Any], query: Any) -> bool:
    """Does a stored event pass an ``EventQuery``'s filters (the memory driver's and the
    stream's check; the Mongo driver says the same as a filter)?"""
    if query.keys and doc["key"] not in query.keys:
        return False
    if query.names and doc["name"] not in query.names:
        return False
    if query.kinds and doc["kind"] not in query.kinds:
        return False
    if query.plan_ids and doc.get("plan_id") not in query.plan_ids:
        return False
    if query.worker_id is not None and doc.get("worker_id") != query.worker_id:
        return False
    if query.time_from is not None and doc["time"] < query.time_from:
        return False
    if query.time_to is not None and doc["time"] >= query.time_to:
        return False
    if query.written_from is not None and doc["written"] < query.written_from:
        return False
    return not (query.after is not None and (doc["written"], doc["id"]) <= tuple(query.after))
