"""Cluster-wide flow limits (SPEC G5): at most ``max_running`` attempts at once, and at most ``rate``
starts per period, per task name or per named limit shared by several names.

A limit lives in the store (collection ``mscheduler_limits``, one document per limit key), so every
consumer obeys the same values, and operators edit it at run time (``Operations.set_limit``). The
document holds the state the limit needs, and every change of that state is one atomic update of
that one document:

* ``slots``: ``[{a: attempt token, w: worker id, e: expire}]`` — a concurrency slot is leased like a
  worker entry: acquired just before the claim and stamped with the claim's attempt token, its
  expiry moved with the task's lease (the pinger extends the slots before it renews the leases),
  released with the finish, and reclaimed by the next acquire once it has expired.
* ``starts``: ``[{a: attempt token, t: start time in epoch ms}]`` — the sliding log of starts
  within the last ``rate`` period (only while a rate is set).

``acquire`` grants ``min(asked, max_running - live slots, rate_n - starts in the window)`` slots
in one write; the claim that follows starts at most one task per granted slot, with the same
``now`` (so a start's stored time is the grant's) and a first lease that ends no later than its
slot. Why no limit can be exceeded: docs/design.md, "Limits".

This module holds the user-facing model (``Limit``, ``Rate``, ``LimitInfo``) and the rules both
drivers apply (``grant``, ``settle``: the memory driver runs them, the Mongo driver writes the
same as an update pipeline; the conformance suite checks that they agree).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import validate_name

MAX_RATE_N = 10_000  # starts kept in one document's sliding log
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
            raise InvalidInput(f"invalid rate {text!r}: expected like '10/s', '1000/h' or '5/2m'")
        n, count, unit = int(match.group(1)), match.group(2), match.group(3)
        try:
            return cls(n=n, period=timedelta(seconds=float(count or 1) * _UNITS[unit]))
        except ValueError as exc:
            raise InvalidInput(f"invalid rate {text!r}: {exc}") from exc

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
            why = str(error["msg"]).removeprefix("Value error, ")
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


def epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def from_storage(doc: Mapping[str, Any], now: datetime) -> LimitInfo:
    rate = None
    if doc.get("rate_n") is not None:
        rate = Rate(n=doc["rate_n"], period=timedelta(milliseconds=doc["rate_period_ms"]))
    limit = Limit(key=doc["_id"], names=tuple(doc["names"]), max_running=doc.get("max_running"), rate=rate)
    live = [s for s in doc.get("slots", []) if s["e"] > now]
    return LimitInfo(
        limit=limit,
        running=len(live),
        recent_starts=len(recent_starts(doc, now)),
        holders=tuple((s["w"], s["a"], s["e"]) for s in live),
        update_time=doc.get("update_time"),
    )


def recent_starts(doc: Mapping[str, Any], now: datetime, drop: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The starts inside the rate window ``(now - period, now]`` (none without a rate)."""
    if doc.get("rate_n") is None:
        return []
    cutoff = epoch_ms(now) - doc["rate_period_ms"]
    return [s for s in doc.get("starts", []) if s["t"] > cutoff and s["a"] not in drop]


def grant(
    doc: dict[str, Any], worker_id: str, attempts: Sequence[str], now: datetime, expire: datetime
) -> None:
    """``acquire`` on one limit document, in place (the memory driver; the Mongo pipeline is the
    same): drop expired slots and starts out of the window (and any earlier grant of these
    attempts: a retried acquire is not counted twice), then grant the first ``room`` attempts,
    ``room = min(asked, max_running - live, rate_n - recent)``."""
    mine = set(attempts)
    slots = [s for s in doc.get("slots", []) if s["e"] > now and s["a"] not in mine]
    starts = recent_starts(doc, now, drop=list(mine))
    room = len(attempts)
    if doc.get("max_running") is not None:
        room = min(room, doc["max_running"] - len(slots))
    if doc.get("rate_n") is not None:
        room = min(room, doc["rate_n"] - len(starts))
    granted = list(attempts[: max(room, 0)])
    doc["slots"] = slots + [{"a": a, "w": worker_id, "e": expire} for a in granted]
    if doc.get("rate_n") is not None:
        doc["starts"] = starts + [{"a": a, "t": epoch_ms(now)} for a in granted]
    else:
        doc["starts"] = []


def granted_of(doc: Mapping[str, Any], worker_id: str, attempts: Sequence[str], now: datetime) -> list[str]:
    """Which of ``attempts`` hold a live slot of ``worker_id`` in ``doc`` (in asked order)."""
    held = {s["a"] for s in doc.get("slots", []) if s["w"] == worker_id and s["e"] > now}
    return [a for a in attempts if a in held]


def held_in(
    docs: Iterable[Mapping[str, Any]], worker_id: str, attempts: Sequence[str], now: datetime
) -> dict[str, str]:
    """``held_slots`` over limit documents: attempt -> the key of the limit where ``worker_id``
    holds a live slot for it (an attempt token is granted by one limit at most)."""
    wanted = set(attempts)
    return {
        s["a"]: doc["_id"]
        for doc in docs
        for s in doc.get("slots", [])
        if s["a"] in wanted and s["w"] == worker_id and s["e"] > now
    }


def acquire_result_fields(doc: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """What an ``AcquireResult`` says of the limit after the grant (besides the grants)."""
    return {
        "retry_at": retry_hint(doc, now),
        "live": sum(1 for s in doc.get("slots", []) if s["e"] > now),
        "max_running": doc.get("max_running"),
        "rate": doc.get("rate_n") is not None,
    }


def retry_hint(doc: Mapping[str, Any], now: datetime) -> datetime | None:
    """When the rate window frees a start (its oldest start leaves it), if the rate is what binds."""
    starts = recent_starts(doc, now)
    if doc.get("rate_n") is None or len(starts) < doc["rate_n"]:
        return None
    return datetime.fromtimestamp((min(s["t"] for s in starts) + doc["rate_period_ms"]) / 1000, tz=now.tzinfo)


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
    live slot in ``extend`` (never revive an expired one), drop expired slots. Returns the
    attempts of ``extend`` whose slot is live afterwards."""
    dropped = set(release) | set(unused)
    slots = []
    for slot in doc.get("slots", []):
        if slot["e"] <= now or (slot["w"] == worker_id and slot["a"] in dropped):
            continue
        if slot["w"] == worker_id and slot["a"] in extend:
            slot = {"a": slot["a"], "w": slot["w"], "e": extend[slot["a"]]}
        slots.append(slot)
    doc["slots"] = slots
    if unused:
        gone = set(unused)
        doc["starts"] = [s for s in doc.get("starts", []) if s["a"] not in gone]
    return [s["a"] for s in slots if s["w"] == worker_id and s["a"] in extend and s["e"] > now]
