"""Cluster-wide flow limits: at most ``max_running`` attempts at once, and at most ``rate``
starts per period, per task name or per named limit shared by several names.

A limit lives in the store (collection ``mscheduler_limits``, one document per limit key), so every
consumer obeys the same values, and operators edit it at run time (``Operations.set_limit``). The
document holds the state the limit needs, and every change of that state is one atomic update of
that one document:

* ``slots``: ``{attempt token: {w: worker id, e: expire, b: rate bucket}}`` — a concurrency slot
  is leased like a worker entry: acquired just before the claim and stamped with the claim's
  attempt token, its expiry moved with the task's lease (the pinger extends the slots before it
  renews the leases), released with the finish, and reclaimed by the next acquire once it has
  expired.
* ``starts``: ``{bucket: count}`` — the rate's starts in the last ``rate`` period, counted per
  time bucket (the period / 1000, at least a millisecond; only while a rate is set).

``acquire`` grants ``min(asked, max_running - live slots, rate_n - starts in the window)`` slots
in one write; the claim that follows starts at most one task per granted slot, with the same
``now`` (so a start's stored time is the grant's) and a first lease that ends no later than its
slot. Why no limit can be exceeded: docs/design.md, "Limits".

This module holds the user-facing model (``Limit``, ``Rate``, ``LimitInfo``) and the rules both
drivers apply (``grant``, ``settle``: the memory driver runs them, the Mongo driver writes the
same as an update pipeline; the conformance suite checks that they agree).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mscheduler.domain.exceptions import InvalidInput, error_reason
from mscheduler.domain.model import validate_name

MAX_RATE_N = 10_000  # starts per period
MAX_RATE_PERIOD = timedelta(days=7)
MAX_RUNNING_MAX = 100_000
MAX_NAMES = 100
DEFAULT_SLOT_LEASE = timedelta(seconds=30)

_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86_400}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*(ms|sec|s|min|m|h|d)\s*$")


def _ms(value: timedelta) -> int:
    return int(value / timedelta(milliseconds=1))


class Rate(BaseModel):
    """``n`` starts per ``period`` (a sliding window: no window of that length holds more)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=1, le=MAX_RATE_N)
    period: timedelta

    @field_validator("period")
    @classmethod
    def _period(cls, value: timedelta) -> timedelta:
        if not timedelta(milliseconds=1) <= value <= MAX_RATE_PERIOD:
            raise ValueError("the period must be from 1 ms to 7 days")
        return timedelta(milliseconds=_ms(value))

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"10/s"``, ``"1000/h"``, ``"5/2m"``, ``"100/500ms"`` (units ms, s, m / min, h, d)."""
        match = _RATE_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidInput("invalid rate: expected like '10/s', '1000/h' or '5/2m'")
        n, count, unit = int(match.group(1)), match.group(2), match.group(3)
        try:
            return cls(n=n, period=timedelta(seconds=float(count or 1) * _UNITS[unit]))
        except ValueError as exc:
            raise InvalidInput(f"invalid rate: {exc}") from exc

    def __str__(self) -> str:
        return f"{self.n}/{_ms(self.period)}ms"


class Limit(BaseModel):
    """A flow limit: ``key`` (by default the one task name it limits), the task ``names`` it covers
    (default ``[key]``; a name belongs to at most one limit), ``max_running`` (attempts running
    at once across the cluster; 0 holds the names back) and / or ``rate`` (starts per period;
    ``Rate`` or a string such as ``"10/s"``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    names: tuple[str, ...] = ()
    max_running: int | None = Field(None, ge=0, le=MAX_RUNNING_MAX)
    rate: Rate | None = None

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        return validate_name(value)

    @field_validator("names")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_NAMES:
            raise ValueError(f"at most {MAX_NAMES} names per limit")
        for name in value:
            validate_name(name)
        if len(set(value)) != len(value):
            raise ValueError("a name is listed twice")
        return value

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        return Rate.parse(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _complete(self) -> Limit:
        if self.max_running is None and self.rate is None:
            raise ValueError("a limit needs max_running, rate or both")
        if not self.names:
            object.__setattr__(self, "names", (self.key,))
        return self

    def to_storage(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "max_running": self.max_running,
            "rate_n": self.rate.n if self.rate else None,
            "rate_period_ms": _ms(self.rate.period) if self.rate else None,
        }


def checked_limit(**fields: Any) -> Limit:
    """A ``Limit`` from user input; a clear ``InvalidInput`` otherwise."""
    try:
        return Limit(**fields)
    except ValidationError as exc:  # where and why, one line, without echoing the input
        reasons = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            why = error_reason(error)
            reasons.append(f"{where}: {why}" if where else why)
        raise InvalidInput(f"invalid limit: {'; '.join(reasons)}") from exc
    except ValueError as exc:
        raise InvalidInput(f"invalid limit: {exc}") from exc


@dataclass(slots=True, frozen=True)
class LimitInfo:
    """A limit as stored, with its state at ``now``: ``running`` live slots (their holders in
    ``holders``: ``(worker id, attempt, expire)``), ``recent_starts`` in the current window."""

    limit: Limit
    running: int
    recent_starts: int
    holders: tuple[tuple[str, str, datetime], ...]
    update_time: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """The shape the REST API and ``mscheduler limits ... --json`` show (times as datetimes);
        ``rate`` is ``"<n>/<period ms>ms"``, which ``set_limit`` takes back."""
        limit, rate = self.limit, self.limit.rate
        return {
            "key": limit.key,
            "names": list(limit.names),
            "max_running": limit.max_running,
            "rate": str(rate) if rate is not None else None,
            "rate_n": rate.n if rate is not None else None,
            "rate_period_seconds": rate.period.total_seconds() if rate is not None else None,
            "running": self.running,
            "recent_starts": self.recent_starts,
            "holders": [{"worker_id": w, "attempt": a, "expire_time": e} for w, a, e in self.holders],
            "update_time": self.update_time,
        }


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(when: datetime) -> int:
    """Milliseconds since the epoch, exactly (``timestamp() * 1000`` may round a millisecond down)."""
    return (when.astimezone(UTC) - _EPOCH) // timedelta(milliseconds=1)


# -- the state of a limit, and the rules both drivers apply to it ---------------------------------
#
# ``slots``: {attempt token: {w: holder, e: expire, b: the start's bucket or None}} - an object
# keyed by token, not an array: granting adds fields, releasing removes them, extending changes
# one field, so a write's oplog entry (a delta of the fields that changed) stays the size of the
# change whatever the number of slots; an array would shift every later element on a removal and
# the server would log the whole document.
# ``starts``: {bucket: count} - the rate's starts counted per time bucket of the period / 1000
# (at least 1 ms: periods up to a second are exact to the stored millisecond), at most 1001
# buckets however high the rate; ``starts_w`` is the width they were counted with.
# ``live``, ``recent``, ``retry_ms``: what the last acquire left (its reply is projected to them
# and to the asked slots, so it does not grow with the limit either).

RATE_BUCKETS = 1000
# a holder longer than this is stored as a digest, so that max_running (up to 100,000) slots fit
# one document (16 MiB) whatever the worker ids' length (executors' go up to 200 characters)
HOLDER_MAX = 40


def holder_id(worker_id: str) -> str:
    """How a slot names its worker: the id itself, or ``#`` and a digest of a long one."""
    if len(worker_id) <= HOLDER_MAX:
        return worker_id
    return "#" + hashlib.sha256(worker_id.encode()).hexdigest()[: HOLDER_MAX - 1]


def bucket_width(period_ms: int) -> int:
    """Milliseconds per rate bucket: the period / ``RATE_BUCKETS``, at least 1."""
    return max(1, period_ms // RATE_BUCKETS)


def bucket_key(now_ms: int, width: int) -> str:
    return str(now_ms // width)


def window_floor(now_ms: int, period_ms: int, width: int) -> int:
    """The first bucket a start of the window ``(now - period, now]`` may be in: bucket ``b``
    holds times ``[b * w, b * w + w - 1]``, and some of them are in the window iff
    ``b * w + w - 1 > now - period``. With ``w`` = 1 ms that is the exact sliding window; wider
    buckets count a start up to ``w`` longer (never shorter: a rate is never exceeded)."""
    return (now_ms - period_ms + 1) // width


def counted_starts(doc: Mapping[str, Any], now: datetime) -> dict[str, int]:
    """The buckets of ``starts`` inside the rate window at ``now`` (all of them, conservatively,
    if they were counted with another width: a period changed since)."""
    if doc.get("rate_n") is None:
        return {}
    period = doc["rate_period_ms"]
    width = bucket_width(period)
    starts = dict(doc.get("starts") or {})
    if doc.get("starts_w", width) != width:
        return starts
    low = window_floor(epoch_ms(now), period, width)
    return {k: n for k, n in starts.items() if int(k) >= low}


def _slots(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(doc.get("slots") or {})


def from_storage(doc: Mapping[str, Any], now: datetime) -> LimitInfo:
    rate = None
    if doc.get("rate_n") is not None:
        rate = Rate(n=doc["rate_n"], period=timedelta(milliseconds=doc["rate_period_ms"]))
    limit = Limit(key=doc["_id"], names=tuple(doc["names"]), max_running=doc.get("max_running"), rate=rate)
    live = [(a, s) for a, s in _slots(doc).items() if s["e"] > now]
    return LimitInfo(
        limit=limit,
        running=len(live),
        recent_starts=sum(counted_starts(doc, now).values()),
        holders=tuple((s["w"], a, s["e"]) for a, s in live),
        update_time=doc.get("update_time"),
    )


def pre_rate_slot(slot: Mapping[str, Any]) -> bool:
    """On a limit with a rate: a slot granted while it had none (no start counted for it)."""
    return slot.get("b") is None


def grant(
    doc: dict[str, Any],
    worker_id: str,
    attempts: Sequence[str],
    now: datetime,
    expire: datetime,
    release: Sequence[str] = (),
) -> None:
    """``acquire`` on one limit document, in place (the memory driver; the Mongo driver's update
    pipeline is the same, checked equal by the conformance suite): drop expired slots, the slots
    of this worker's ended attempts (``release``: their starts stay counted) and the buckets
    that left the window; drop earlier grants of these attempts with their starts (a retried
    acquire is not counted twice); then grant the first ``room`` attempts a slot (and a start in
    the current bucket), ``room = min(asked, max_running - live, rate_n - recent)``."""
    mine = set(attempts)
    ended = set(release)
    rated = doc.get("rate_n") is not None
    slots = _slots(doc)
    starts: dict[str, int] = {}
    width, current = 1, ""
    if rated:
        period = doc["rate_period_ms"]
        width = bucket_width(period)
        now_ms = epoch_ms(now)
        current = bucket_key(now_ms, width)
        if doc.get("starts_w", width) != width and doc.get("starts"):
            # the period changed: every start counted so far goes to the bucket of the latest
            # (later than each: conservative, a start is counted no shorter than it should be)
            latest = max(int(k) for k in doc["starts"])
            key = str(((latest + 1) * doc["starts_w"] - 1) // width)
            starts = {key: sum(doc["starts"].values())}
        else:
            starts = dict(doc.get("starts") or {})
        low = window_floor(now_ms, period, width)
        starts = {k: n for k, n in starts.items() if int(k) >= low}
        for a in mine & slots.keys():  # an earlier grant of these attempts: its start given back
            given = slots[a].get("b")
            if given in starts:
                starts[given] -= 1
        starts = {k: n for k, n in starts.items() if n > 0}
    holder = holder_id(worker_id)
    kept = {
        a: s
        for a, s in slots.items()
        if s["e"] > now and a not in mine and not (a in ended and s["w"] == holder)
    }
    # Slots granted while the limit had no rate (``b`` None; pre_rate_slot): a start through one
    # may come, or came, uncounted (a reserved grant is used later, without a write). While one
    # is in the document it counts as a start in every window; when it leaves (expired or
    # released) its start is counted in the current bucket - no earlier than it happened, so no
    # window misses it. A retried grant of the same attempt never started: no start.
    pre_live = sum(1 for s in kept.values() if pre_rate_slot(s)) if rated else 0
    pre_gone = (
        sum(1 for a, s in slots.items() if pre_rate_slot(s) and a not in kept and a not in mine)
        if rated
        else 0
    )
    slots = kept
    if pre_gone:
        starts[current] = starts.get(current, 0) + pre_gone
    room = len(attempts)
    if doc.get("max_running") is not None:
        room = min(room, doc["max_running"] - len(slots))
    if rated:
        room = min(room, doc["rate_n"] - sum(starts.values()) - pre_live)
    granted = list(attempts[: max(room, 0)])
    for a in granted:
        slots[a] = {"w": holder, "e": expire, "b": current if rated else None}
    if rated and granted:
        starts[current] = starts.get(current, 0) + len(granted)
    doc["slots"] = slots
    doc["starts"] = starts
    doc["starts_w"] = width if rated else None
    doc["live"] = len(slots)
    doc["recent"] = sum(starts.values()) + pre_live
    doc["retry_ms"] = (
        (min(int(k) for k in starts) + 1) * width + doc["rate_period_ms"] - 1
        if rated and starts and doc["recent"] >= doc["rate_n"]
        else None
    )


def granted_of(doc: Mapping[str, Any], worker_id: str, attempts: Sequence[str], now: datetime) -> list[str]:
    """Which of ``attempts`` hold a live slot of ``worker_id`` in ``doc`` (in asked order)."""
    holder, slots = holder_id(worker_id), _slots(doc)
    return [a for a in attempts if (s := slots.get(a)) is not None and s["w"] == holder and s["e"] > now]


def held_in(
    docs: Iterable[Mapping[str, Any]], worker_id: str, attempts: Sequence[str], now: datetime
) -> dict[str, str]:
    """``held_slots`` over limit documents: attempt -> the key of the limit where ``worker_id``
    holds a live slot for it (an attempt token is granted by one limit at most)."""
    return {a: doc["_id"] for doc in docs for a in granted_of(doc, worker_id, attempts, now)}


def acquire_result_fields(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """What an ``AcquireResult`` says of the limit after the grant (besides the grants): from the
    summary the grant wrote (``live``, ``retry_ms``), so the reply need not carry the slots."""
    retry_ms = doc.get("retry_ms")
    return {
        "retry_at": datetime.fromtimestamp(retry_ms / 1000, tz=now.tzinfo) if retry_ms is not None else None,
        "live": doc.get("live", 0),
        "max_running": doc.get("max_running"),
        "rate": doc.get("rate_n") is not None,
    }


def settle(
    doc: dict[str, Any],
    worker_id: str,
    now: datetime,
    extend: Mapping[str, datetime],
    release: Sequence[str],
    unused: Sequence[str],
) -> list[str]:
    """``update_slots`` on one document, in place: release the slots of ``release`` and ``unused``
    (an ``unused`` grant also gives its start back: nothing started), move the expiry of each
    live slot in ``extend`` (never revive an expired one), drop expired slots. Only this worker's
    slots are touched. Returns the attempts of ``extend`` whose slot is live afterwards.

    On a limit with a rate, a slot granted before it had one (``pre_rate_slot``) is not dropped
    here but ended (its expiry set to ``now`` at the latest): the next ``grant`` drops it and
    counts its start (an ``unused`` one never started: dropped)."""
    holder = holder_id(worker_id)
    rated = doc.get("rate_n") is not None
    dropped, gone = set(release) | set(unused), set(unused)
    slots: dict[str, dict[str, Any]] = {}
    starts = dict(doc.get("starts") or {})
    for a, slot in _slots(doc).items():
        ours = slot["w"] == holder
        if ours and a in gone and slot.get("b") in starts:
            starts[slot["b"]] -= 1
        if rated and pre_rate_slot(slot):
            if ours and a in gone:
                continue
            if ours and a in dropped:
                slots[a] = slot | {"e": min(slot["e"], now)}
                continue
            if slot["e"] <= now:
                slots[a] = slot
                continue
        elif slot["e"] <= now or (ours and a in dropped):
            continue
        if ours and a in extend:
            slot = slot | {"e": extend[a]}
        slots[a] = slot
    doc["slots"] = slots
    if gone:
        doc["starts"] = {k: n for k, n in starts.items() if n > 0}
    return [a for a in extend if (s := slots.get(a)) is not None and s["w"] == holder and s["e"] > now]
