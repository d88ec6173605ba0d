"""Debounce and throttle by key: what a send of a key does to the task that holds it.

A task sent with ``TaskOption(debounce=Debounce(...))`` or ``TaskOption(throttle=Throttle(...))``
is a *flow send*: instead of "create unless the key exists" (SPEC F1), the send looks at the task
and does one of (``flow_decision``):

* **new** — create the task, or start a new generation of a finished one (as a reset does: new
  params and option, no entries, a fresh budget), due at the rule's time;
* **update** — the task is pending (no attempt running): its params are replaced (or merged,
  ``params="merge"``: a shallow merge of two objects) and its run time pushed out;
* **follow** — an attempt is running: the task is not touched; the send is kept as its
  *follow-up* (``state.follow``: params, due time) and becomes the next generation when the run
  ends (``follow_up_due``: the write that ends the last running attempt applies it), so a run
  never starts while another of the key runs;
* **drop** — nothing runs for this send (it returns False); the rule's bookkeeping
  (``state.flow.last``) is still written.

Every decision is one conditional write of the task's document (the memory driver runs this
function; the Mongo driver writes the same as one upsert pipeline; the conformance suite and a
model-based test check that they agree), so concurrent publishers are serialized by the store.

Rules (``now``: the send's time; ``first``: the first send the pending generation or follow-up
took, ``last``: the latest send; ``start``: the latest attempt's start, else the due time):

===================== =========================== ================== ==========================
rule                  no task / finished           pending            running
===================== =========================== ================== ==========================
debounce trailing     new, due now + window        update, due        follow, due
                                                   min(now + window,  min(now + window,
                                                   first + max_wait)  first + max_wait)
debounce leading      new, due now (finished: only drop               follow due now once quiet
                      once quiet: ``last`` at                         (no follow-up yet), else
                      least a window ago, or                          drop
                      ``first`` max_wait ago)
throttle drop         new, due now (finished: only drop               follow due now if start +
                      from start + period)                            period passed (no
                                                                      follow-up yet), else drop
throttle coalesce     new, due max(now, start +    update (params     follow, due max(now,
                      period)                      only)              start + period)
===================== =========================== ================== ==========================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

MAX_WINDOW = timedelta(days=366)

NEW = "new"
UPDATE = "update"
FOLLOW = "follow"
DROP = "drop"
ACTIONS = (NEW, UPDATE, FOLLOW, DROP)


def _ms(value: timedelta) -> int:
    return int(value / timedelta(milliseconds=1))


def _window(value: timedelta) -> timedelta:
    if not timedelta(milliseconds=1) <= value <= MAX_WINDOW:
        raise ValueError("must be from 1 ms to 366 days")
    return timedelta(milliseconds=_ms(value))


class Debounce(BaseModel):
    """Sends of one key coalesce: ``trailing`` (the default) runs once, ``window`` after the
    last send (at the latest ``max_wait`` after the first); ``leading`` runs at the first send
    and drops the sends that follow until the key has been quiet for ``window`` (or ``max_wait``
    passed since that run's send). ``params``: a coalesced send replaces the params, or merges
    its object into them (``"merge"``, shallow)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: timedelta
    max_wait: timedelta | None = None
    mode: Literal["trailing", "leading"] = "trailing"
    params: Literal["replace", "merge"] = "replace"

    @field_validator("window", "max_wait")
    @classmethod
    def _check(cls, value: timedelta | None) -> timedelta | None:
        return _window(value) if value is not None else None

    @model_validator(mode="after")
    def _max_after_window(self) -> Debounce:
        if self.max_wait is not None and self.max_wait < self.window:
            raise ValueError("max_wait must be at least the window")
        return self

    def to_storage(self) -> dict[str, Any]:
        return {
            "window_ms": _ms(self.window),
            "max_wait_ms": _ms(self.max_wait) if self.max_wait is not None else None,
            "mode": self.mode,
            "params": self.params,
        }

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> Debounce:
        max_wait = doc.get("max_wait_ms")
        return cls(
            window=timedelta(milliseconds=doc["window_ms"]),
            max_wait=timedelta(milliseconds=max_wait) if max_wait is not None else None,
            mode=doc.get("mode", "trailing"),
            params=doc.get("params", "replace"),
        )


class Throttle(BaseModel):
    """At most one run of a key per ``period`` (from the start of its latest attempt): a send
    within the period is dropped (``"drop"``, the default), or coalesced into the next run, due
    when the period ends (``"coalesce"``; ``params``: replace or merge, as for ``Debounce``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    period: timedelta
    mode: Literal["drop", "coalesce"] = "drop"
    params: Literal["replace", "merge"] = "replace"

    @field_validator("period")
    @classmethod
    def _check(cls, value: timedelta) -> timedelta:
        return _window(value)

    def to_storage(self) -> dict[str, Any]:
        return {"period_ms": _ms(self.period), "mode": self.mode, "params": self.params}

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> Throttle:
        return cls(
            period=timedelta(milliseconds=doc["period_ms"]),
            mode=doc.get("mode", "drop"),
            params=doc.get("params", "replace"),
        )


def flow_rule(option: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The stored rule of a flow send's option (``debounce`` or ``throttle``), with its kind."""
    if option.get("debounce"):
        return {"kind": "debounce", **option["debounce"]}
    if option.get("throttle"):
        return {"kind": "throttle", **option["throttle"]}
    return None


# a task's phase for a flow send (``flow_phase``)
ABSENT = "absent"
PENDING = "pending"
RUNNING = "running"
FINISHED = "finished"
OTHER = "other"  # a parent or a child: a flow send never touches a family
TERMINAL = ("succeeded", "failed", "expired", "cancelled")


def flow_phase(doc: Mapping[str, Any] | None) -> str:
    """Where a task stands for a flow send: absent, running (an attempt is running), pending,
    finished (terminal, nothing running), or other (a family's member, never touched)."""
    if doc is None:
        return ABSENT
    if "children" in doc or "parent" in doc:
        return OTHER
    state = doc["state"]
    if state["running_cnt"] > 0:
        return RUNNING
    if state["status"] in TERMINAL:
        return FINISHED
    return PENDING


def latest_start(doc: Mapping[str, Any]) -> datetime:
    """When the task's latest attempt started (its due time if none did): a throttle's period
    counts from it."""
    starts: list[datetime] = [e["start_time"] for e in doc["state"]["worker_states"]]
    due: datetime = doc["option"]["run_at"]
    return max(starts) if starts else due


@dataclass(slots=True, frozen=True)
class FlowDecision:
    """What a flow send does (``action``, one of ``ACTIONS``): the due time of a new generation,
    an updated task or a follow-up (None: unchanged), whether the sent params are taken (replace
    or merge: ``take``), and the rule's bookkeeping (``first``, ``last``) to store with it."""

    action: str
    due: datetime | None = None
    take: bool = False
    first: datetime | None = None
    last: datetime | None = None


def flow_decision(doc: Mapping[str, Any] | None, rule: Mapping[str, Any], now: datetime) -> FlowDecision:
    """The decision of a flow send at ``now`` on ``doc`` (None: no task), by ``rule``
    (``flow_rule``). The table in the module's docstring, as code: the one definition."""
    phase = flow_phase(doc)
    if phase == OTHER:
        return FlowDecision(DROP)
    flow: Mapping[str, Any] = (doc["state"].get("flow") or {}) if doc is not None else {}
    follow: Mapping[str, Any] | None = doc["state"].get("follow") if doc is not None else None
    last = flow.get("last")
    if rule["kind"] == "debounce":
        window = timedelta(milliseconds=rule["window_ms"])
        max_wait = rule.get("max_wait_ms")
        cap = timedelta(milliseconds=max_wait) if max_wait is not None else None
        if rule.get("mode") == "leading":
            first = flow.get("first")
            waited = cap is not None and first is not None and now - first >= cap
            quiet = last is None or now - last >= window or waited
            if phase == ABSENT or (phase == FINISHED and quiet):
                return FlowDecision(NEW, now, True, now, now)
            if phase == RUNNING and follow is None and quiet:
                return FlowDecision(FOLLOW, now, True, now, now)
            return FlowDecision(DROP, last=now)
        if phase in (ABSENT, FINISHED):
            return FlowDecision(NEW, now + window, True, now, now)
        first = (follow or {}).get("first") if phase == RUNNING else flow.get("first")
        first = first if first is not None else now
        due = now + window if cap is None else min(now + window, first + cap)
        return FlowDecision(UPDATE if phase == PENDING else FOLLOW, due, True, first, now)
    period = timedelta(milliseconds=rule["period_ms"])
    if phase == ABSENT:
        return FlowDecision(NEW, now, True, now, now)
    assert doc is not None
    free_at = latest_start(doc) + period
    if rule.get("mode") == "coalesce":
        if phase == FINISHED:
            return FlowDecision(NEW, max(now, free_at), True, now, now)
        if phase == PENDING:
            return FlowDecision(UPDATE, None, True, flow.get("first"), now)
        due = follow["due"] if follow is not None else max(now, free_at)
        first = follow["first"] if follow is not None else now
        return FlowDecision(FOLLOW, due, True, first, now)
    if phase == FINISHED and now >= free_at:
        return FlowDecision(NEW, now, True, now, now)
    if phase == RUNNING and follow is None and now >= free_at:
        return FlowDecision(FOLLOW, now, True, now, now)
    return FlowDecision(DROP, last=now)


def merged_params(current: Any, sent: Any, mode: str) -> Any:
    """The params a coalesced send leaves: ``sent`` (replace), or with ``"merge"`` the shallow
    merge of two objects (``current`` first, ``sent`` over it); anything else is replaced."""
    if mode == "merge" and isinstance(current, dict) and isinstance(sent, dict):
        return {**current, **sent}
    return sent
