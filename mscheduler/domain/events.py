"""What an event document is: its kinds, its stored form and its id rules.

Shared by both drivers (which record the events a store-level write causes: ``sent``,
``expired``, ``lease_lost`` of a lease pass, the operators' controls, ``edited``) and by
``mscheduler.services.events`` (the consumer's buffered ``claimed`` and outcome events, the read side).
It imports nothing from the drivers, so every module may import it.

Ids are deterministic wherever one event may be written twice (a retried insert whose reply
was lost; two consumers' lease passes marking the same entry): the same event gets the same
``_id``, and a duplicate-key insert is ignored, so it is stored once. Elsewhere (sent, controls,
edited) an id names its writer and the writer's sequence number, so two events of one kind in one
millisecond never share one.

Order: every writer (a store's driver, a consumer's or an API server's recorder) is
an ``EventWriter`` with a random id and its own monotonic sequence, stamped on each event it
makes (``writer``, ``seq``). A task's events are listed by ``(time, step, seq, id)``: ``time`` in
milliseconds; ``step`` puts the events of one millisecond in the causal order of the task's
writes whoever wrote them (generation, then the attempt's position, then sent < claimed <
outcome < task-level events: controls, edits, expiry, lost leases); ``seq`` then keeps one
writer's events of one millisecond and one step in the order it wrote them (an operator's
pause, resume, pause in one millisecond).
"""

from __future__ import annotations

import itertools
import secrets
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


# Where an event stands among a task's events of the same millisecond (``step``): its generation
# (restarts and resets start one), its attempt's position in the generation, then its rank.
_RANK = {EventKind.SENT: 0, EventKind.CLAIMED: 2}
_OUTCOME_RANK = 3  # an attempt's end, written by its worker
# controls, edits, expiry and lost leases: at the position the task had when they were written
_TASK_LEVEL_RANK = 5
_TASK_LEVEL = frozenset(
    {
        EventKind.LEASE_LOST,
        EventKind.EXPIRED,
        EventKind.CANCELLED,
        EventKind.PAUSED,
        EventKind.RESUMED,
        EventKind.RESTARTED,
        EventKind.REMOVED,
        EventKind.EDITED,
    }
)
# each kind's rank, looked up once per event
_STEP_RANK = {
    kind: _RANK[kind] if kind in _RANK else _TASK_LEVEL_RANK if kind in _TASK_LEVEL else _OUTCOME_RANK
    for kind in EventKind
}
# the same by a kind's value (``kind._value_``: a plain attribute; ``kind.value`` and a dict keyed
# by the enum member each call Python code per event)
_STEP_RANK_OF_VALUE = {kind._value_: rank for kind, rank in _STEP_RANK.items()}
POSITION_BITS = 21  # attempt positions up to 2 million (a task keeps at most 10,000 entries)
GENERATION_SHIFT = POSITION_BITS + 3
_POSITION_END = 1 << POSITION_BITS


def event_step(kind: EventKind, generation: int, position: int) -> int:
    """A task's events of one millisecond in causal order: ``generation``, then ``position`` (the
    attempt's number in its generation; for a task-level event, how many attempts the task had
    when it was written), then sent < claimed < outcome < task-level events."""
    rank = _STEP_RANK_OF_VALUE[kind._value_]
    if not 0 <= position < _POSITION_END:
        position = min(max(position, 0), _POSITION_END - 1)
    return ((generation if generation > 0 else 0) << GENERATION_SHIFT) | (position << 3) | rank


class EventWriter:
    """One writer of events: a random id and its own monotonic sequence (1, 2, ...), stamped on
    every event it makes, in the order it makes them. A store's driver, a consumer's recorder
    and an API server's recorder are each one."""

    def __init__(self, writer_id: str | None = None) -> None:
        self.id = writer_id or secrets.token_hex(6)
        self._seq = itertools.count(1)
        self.last = 0

    def next_seq(self) -> int:
        self.last = next(self._seq)
        return self.last


def position_of(state: Mapping[str, Any]) -> tuple[int, int]:
    """(generation, number of attempts) of a stored task's ``state``: where a task-level event
    written now stands among its events."""
    return int(state.get("generation") or 0), len(state.get("worker_states") or ())


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
    return f"{key}|{attempt}|{kind._value_}"


def task_event_id(key: str, kind: EventKind, writer: str, seq: int) -> str:
    """A task-level event (sent, a control, edited): its writer and the writer's sequence number
    make it unique (two pauses of one task in one millisecond are two events)."""
    return f"{key}|{kind._value_}|{writer}.{seq}"


def expired_event_id(key: str, deadline: datetime) -> str:
    """``expired``: by the deadline, the same whoever's pass marks it (stored once)."""
    return f"{key}|{EventKind.EXPIRED.value}|{_ms(deadline)}"


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
    writer: EventWriter,
    event_id: str | None = None,
    worker_id: str | None = None,
    attempt: int | None = None,
    generation: int = 0,
    position: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An event's stored form (``written`` is set by the driver when it inserts it), stamped with
    the next number of ``writer``'s sequence. ``attempt``: the attempt's number (its position in
    its generation); ``position``: where a task-level event stands (see ``event_step``); without
    an ``event_id``, the writer's (``task_event_id``)."""
    if detail:
        items = [(str(k), short(v)) for k, v in detail.items() if v is not None]
        kept = dict(items[:DETAIL_MAX_ITEMS])
    else:
        kept = {}
    if time.tzinfo is not UTC:
        time = time.astimezone(UTC) if time.tzinfo else time.replace(tzinfo=UTC)
    seq = writer.next_seq()
    at = position if position is not None else (attempt or 0)
    return {
        "id": event_id if event_id is not None else task_event_id(key, kind, writer.id, seq),
        "kind": kind._value_,
        "key": key,
        "name": name,
        "plan_id": plan_of_key(key),
        "worker_id": worker_id,
        "attempt": attempt,
        "step": event_step(kind, generation, at),
        "writer": writer.id,
        "seq": seq,
        "time": time,
        "detail": kept,
    }


def lost_lease_event(
    writer: EventWriter,
    key: str,
    name: str,
    entry: Mapping[str, Any],
    attempt_no: int,
    now: datetime,
    by: str,
    generation: int = 0,
    position: int | None = None,
) -> dict[str, Any]:
    """``lease_lost`` of one worker entry (its attempt token makes the id): written by a lease
    pass (``by="lease pass"``) and by the worker whose ping found the lease gone (``"ping"``);
    whichever lands first is kept. ``position``: where it stands among the task's events (a
    pass: how many attempts the task has, like any task-level event; default the attempt's)."""
    return event_doc(
        EventKind.LEASE_LOST,
        key,
        name,
        now,
        writer=writer,
        event_id=attempt_event_id(key, entry["attempt"], EventKind.LEASE_LOST),
        worker_id=entry.get("worker_id"),
        attempt=attempt_no,
        generation=generation,
        position=position,
        detail={"by": by, "lease_end": entry.get("ping_expire_time")},
    )


def expired_event(
    writer: EventWriter, key: str, name: str, deadline: datetime, now: datetime, state: Mapping[str, Any]
) -> dict[str, Any]:
    generation, position = position_of(state)
    return event_doc(
        EventKind.EXPIRED,
        key,
        name,
        now,
        writer=writer,
        event_id=expired_event_id(key, deadline),
        generation=generation,
        position=position,
        detail={"deadline": deadline},
    )


def task_event(
    writer: EventWriter,
    kind: EventKind,
    key: str,
    name: str,
    now: datetime,
    state: Mapping[str, Any] | None = None,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """sent, a control or edited: one event at ``now``; ``state``: the task's state as the write
    left it (where the event stands among the task's events; None: a new task)."""
    generation, position = position_of(state) if state is not None else (0, 0)
    return event_doc(
        kind, key, name, now, writer=writer, generation=generation, position=position, detail=detail
    )


def sent_detail(by: str | None, reset: bool) -> dict[str, Any] | None:
    """The detail of a ``sent`` event: who sent the task (when known) and whether the send reset
    a task that had ended (``reset_finished``)."""
    detail: dict[str, Any] = {}
    if by:
        detail["by"] = by
    if reset:
        detail["reset"] = True
    return detail or None


def order_key(doc: Mapping[str, Any]) -> tuple[Any, ...]:
    """Where a stored event stands in a listing: ``(time, step, seq, id)`` (see the module)."""
    return (doc["time"], doc.get("step", 0), doc.get("seq", 0), doc["id"])


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
