"""Derived task state: one definition, computed from the worker entries and the options.

Every write recomputes these fields, so they never drift from ``worker_states``. The memory
driver calls ``derive`` directly; the Mongo driver's ``derive_stages`` is the same function written
as an update pipeline, and the conformance suite checks that both agree.

* ``running_cnt`` / ``success_cnt`` / ``fail_cnt``: entries running / succeeded / failed, lost
  or rejected; ``rejected_cnt``: entries rejected (invalid params), which use up the budget;
  ``attempt_cnt``: the three together, the attempts that count (``TaskInfo.attempts``; the
  listings sort by it).
* ``free_slots``: ``concurrent_worker_cnt - running - succeeded`` (never below 0).
* ``exhausted``: ``fail_cnt > max_unexpected_retries`` (None: unlimited), a rejected entry or a
  final one (the handler raised ``Fail``) — the budget is used — or ``state.broken`` is set (the
  task's document could not be written; the reason is there).
* ``expired``: ``state.expired_at`` is set (the deadline passed before it started): status
  ``expired`` once nothing runs, never claimable.
* ``cancelled``: ``state.cancelled`` ({reason, time}) is set by an operator: status
  ``cancelled`` at once (even while entries run: their finishes are fenced out), never claimable.
* ``paused``: ``state.paused`` is true: not claimable (``claim_at`` None); the status stays.
* ``status``: cancelled > succeeded (enough successes) > failed (budget used, nothing running) > running >
  pending.
* ``retry_at``: the latest ``retry_at`` of a failed or snoozed entry (when it may run again).
* ``claim_at``: when a free slot may be claimed, ``max(run_at, retry_at)``; ``None`` when no slot
  is free or the task is terminal or exhausted. The claim query is served by an index on it.
* ``targeted``: the task names specific workers or groups (claimed first by those).
* ``claimers``: who may claim it now, as ``"<name>|<worker id>"`` (targeted tasks: each named
  worker that holds no running or succeeded entry — no running one with
  ``same_worker_may_repeat``), ``"<name>|g:<group>"`` (each named group: its members, the
  claim's filter checks their entries) or ``"<name>|*"`` (anyone); empty when
  ``claim_at`` is None. The claim and wake-up indexes start with it, so a worker's claim reads
  only tasks it may take (tasks aimed at others are outside its index range), and the change
  stream can tell from it which consumers an update concerns. Names cannot contain ``|``.
  A task with a fairness key (``option.fair_key``) carries it in its tokens:
  ``"<name>#<key>|<who>"`` (names hold no ``#``, keys neither ``#`` nor ``|``), so a claim of
  one key's tasks is an equality on the same index (a *lane*: ``mscheduler.domain.fairness``).
* ``claim_priority``: the priority the claim orders by: the task's, or 0 for a task that ages
  (``option.aging_ms``: its priority turns into a head start in time, below).
* ``order_at``: the time the claim orders by among tasks of one claim priority: ``claim_at``,
  or for a task that ages ``claim_at - priority x aging`` (a task's effective priority at time
  t is ``priority + (t - claim_at) / aging``; comparing two tasks' at the same t gives the same
  order whatever t, so a stored time serves it). ``order_at <= claim_at``; None with ``claim_at``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.model import GROUP_PREFIX, AttemptStatus, TaskStatus

RUNNING = AttemptStatus.RUNNING.value
SUCCEEDED = AttemptStatus.SUCCEEDED.value
REJECTED = AttemptStatus.REJECTED.value
SNOOZED = AttemptStatus.SNOOZED.value
FAILURES = (AttemptStatus.FAILED.value, AttemptStatus.LOST.value, REJECTED)

DERIVED_FIELDS = (
    "running_cnt",
    "success_cnt",
    "fail_cnt",
    "rejected_cnt",
    "attempt_cnt",
    "retry_at",
    "targeted",
    "free_slots",
    "status",
    "claim_at",
    "claimers",
    "claim_priority",
    "order_at",
)

ANYONE = "*"
LANE_MARK = "#"  # between a task's name and its fairness key in a claimer token

# status values as plain strings (derive runs on every write: no enum lookups there)
_PENDING = TaskStatus.PENDING.value
_RUNNING_T = TaskStatus.RUNNING.value
_SUCCEEDED_T = TaskStatus.SUCCEEDED.value
_FAILED = TaskStatus.FAILED.value
_EXPIRED = TaskStatus.EXPIRED.value
_CANCELLED = TaskStatus.CANCELLED.value


def claimer_token(name: str, worker_id: str, lane: str | None = None) -> str:
    """One value of ``state.claimers``: ``name|worker_id`` (``name|*`` for any worker); of a task
    with a fairness key ``lane``: ``name#lane|worker_id``."""
    if lane is None:
        return f"{name}|{worker_id}"
    return f"{name}{LANE_MARK}{lane}|{worker_id}"


def token_name(token: str) -> str:
    """The task name of a claimer token."""
    head = token.split("|", 1)[0]
    return head.split(LANE_MARK, 1)[0]


def token_lane(token: str) -> str | None:
    """The fairness key of a claimer token (None: a task without one)."""
    head = token.split("|", 1)[0]
    return head.split(LANE_MARK, 1)[1] if LANE_MARK in head else None


def laneless(token: str) -> str:
    """A claimer token without its fairness key: ``name|who``."""
    head, _, who = token.partition("|")
    return f"{head.split(LANE_MARK, 1)[0]}|{who}"


def group_token(group: str) -> str:
    """The ``who`` part of a group's claimer token: ``g:<group>`` (worker ids cannot start so)."""
    return f"{GROUP_PREFIX}{group}"


def claimer_tokens(
    names: list[str] | tuple[str, ...],
    worker_id: str,
    groups: Sequence[str] = (),
    lanes: Sequence[str | None] = (None,),
) -> list[str]:
    """The ``state.claimers`` values a worker handling ``names`` (member of ``groups``) may claim,
    of the tasks in ``lanes`` (fairness keys; None: tasks without one)."""
    who = (worker_id, *(group_token(g) for g in groups), ANYONE)
    return [claimer_token(n, w, lane) for lane in lanes for n in names for w in who]


def claim_order(option: Mapping[str, Any], claim_at: datetime | None) -> tuple[int, datetime | None]:
    """``claim_priority`` and ``order_at`` (see the module's docstring)."""
    aging = option.get("aging_ms")
    if not aging:
        return option["priority"], claim_at
    if claim_at is None:
        return 0, None
    return 0, claim_at - timedelta(milliseconds=aging * option["priority"])


def derive(
    name: str,
    option: dict[str, Any],
    worker_states: list[dict[str, Any]],
    broken: bool = False,
    expired: bool = False,
    cancelled: bool = False,
    paused: bool = False,
    *,
    blocked: bool = False,
    marked: str | None = None,
    children: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The derived fields of a task; ``broken``: ``state.broken`` is set (a document error);
    ``expired``: ``state.expired_at`` is set (its deadline passed before it started);
    ``cancelled``: ``state.cancelled`` is set; ``paused``: ``state.paused`` is true.

    Child tasks (``mscheduler.services.children``, see ``family_inputs``): ``blocked``: a sequential child
    waiting for the one before it (not claimable, pending); ``marked``: the status an operator
    set by hand (``state.marked.status``: wins over everything, never claimable); ``children``:
    the statuses of a parent's children (``state.children``): a parent is never claimed, its
    status follows from them (``family_status``)."""
    running = success = failures = rejected = final = 0
    retry_at: datetime | None = None
    for entry in worker_states:
        status = entry["status"]
        if status == RUNNING:
            running += 1
        elif status == SUCCEEDED:
            success += 1
        elif status in FAILURES or status == SNOOZED:
            if status != SNOOZED:
                failures += 1
                rejected += status == REJECTED
                final += entry.get("final") is True
            entry_retry = entry.get("retry_at")
            if entry_retry is not None and (retry_at is None or entry_retry > retry_at):
                retry_at = entry_retry
    cnt = option["concurrent_worker_cnt"]
    free = max(cnt - running - success, 0)
    budget = option.get("max_unexpected_retries")  # None (or missing): unlimited
    exhausted = (budget is not None and failures > budget) or rejected > 0 or final > 0 or broken
    if marked is not None:
        status_value = marked
    elif cancelled:
        status_value = _CANCELLED
    elif children is not None:
        status_value = family_status(children)
    elif success >= cnt:
        status_value = _SUCCEEDED_T
    elif exhausted and running == 0:
        status_value = _FAILED
    elif expired and running == 0:
        status_value = _EXPIRED
    elif running > 0:
        status_value = _RUNNING_T
    else:
        status_value = _PENDING
    claim_at: datetime | None
    if success >= cnt or exhausted or expired or cancelled or paused or free == 0:
        claim_at = None
    elif blocked or marked is not None or children is not None:
        claim_at = None
    else:
        run_at = option["run_at"]
        claim_at = run_at if retry_at is None or run_at >= retry_at else retry_at
    claimers: list[str]
    groups = option.get("specific_groups") or []
    targeted = bool(option["specific_worker_ids"]) or bool(groups)
    lane = option.get("fair_key")
    if claim_at is None:
        claimers = []
    elif targeted:
        # workers barred from claiming it again: running it, or succeeded (unless
        # ``same_worker_may_repeat``: a success does not bar its worker)
        barred = (RUNNING,) if option.get("same_worker_may_repeat") is True else (RUNNING, SUCCEEDED)
        busy_workers = {e["worker_id"] for e in worker_states if e["status"] in barred}
        # a group's members are checked by the claim's filter (they are not listed here)
        claimers = [
            claimer_token(name, w, lane) for w in option["specific_worker_ids"] if w not in busy_workers
        ]
        claimers += [claimer_token(name, group_token(g), lane) for g in groups]
    else:
        claimers = [claimer_token(name, ANYONE, lane)]
    claim_priority, order_at = claim_order(option, claim_at)
    return {
        "running_cnt": running,
        "success_cnt": success,
        "fail_cnt": failures,
        "rejected_cnt": rejected,
        "attempt_cnt": running + success + failures,
        "retry_at": retry_at,
        "targeted": targeted,
        "free_slots": free,
        "status": status_value,
        "claim_at": claim_at,
        "claimers": claimers,
        "claim_priority": claim_priority,
        "order_at": order_at,
    }


CHILD_ENDED_BADLY = (_FAILED, _EXPIRED, _CANCELLED)


def family_status(children: Sequence[str]) -> str:
    """A parent's status from its children's: succeeded when all have; running while one runs;
    failed when one ended without success (failed, expired, cancelled) and none runs (the core's
    rule: a task fails only once nothing runs); else pending."""
    if all(c == SUCCEEDED for c in children):
        return _SUCCEEDED_T
    if any(c == RUNNING for c in children):
        return _RUNNING_T
    if any(c in CHILD_ENDED_BADLY for c in children):
        return _FAILED
    return _PENDING


def family_inputs(state: Mapping[str, Any]) -> dict[str, Any]:
    """The child-task inputs of ``derive`` read from a stored ``state`` (keyword arguments)."""
    marked = state.get("marked")
    children = state.get("children")
    return {
        "blocked": state.get("blocked") is True,
        "marked": marked["status"] if marked else None,
        "children": [c["status"] for c in children] if children is not None else None,
    }


def lease_expiry(worker_states: list[dict[str, Any]]) -> datetime | None:
    """The earliest ping_expire_time among running entries: when a takeover may happen."""
    times = [e["ping_expire_time"] for e in worker_states if e["status"] == RUNNING]
    return min(times) if times else None


def live_attempts(state: Mapping[str, Any], now: datetime) -> list[Mapping[str, Any]]:
    """The entries of any generation (``worker_states`` and ``history``) that hold a live lease
    at ``now``: running, ``ping_expire_time`` after ``now``. While one exists, nothing may make
    the task claimable beyond the slots those entries hold (docs/design.md, "Never twice at
    once across generations"): a restart or a reset would move or drop them, so it is refused."""
    entries = list(state.get("worker_states") or ())
    for generation in state.get("history") or ():
        entries += generation.get("worker_states") or ()
    return [e for e in entries if e["status"] == RUNNING and e["ping_expire_time"] > now]


def stopped_by_pause(state: Mapping[str, Any], attempt: str) -> bool:
    """``attempt`` was told to stop by ``pause(stop_running=True)`` (``state.stop``): its lease is
    not renewed and only its ``released`` settlement is accepted."""
    stop = state.get("stop") or {}
    return stop.get("action") == "pause" and attempt in (stop.get("attempts") or ())


# -- lifecycle fields (retention, uniqueness by params) --------------------------------------------

TERMINAL = (
    TaskStatus.SUCCEEDED.value,
    TaskStatus.FAILED.value,
    TaskStatus.EXPIRED.value,
    TaskStatus.CANCELLED.value,
)
LIVE = (TaskStatus.PENDING.value, TaskStatus.RUNNING.value)


def lifecycle(
    status: str,
    finish_time: datetime | None,
    unique_hash: str | None,
    now: datetime,
    children: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """``state.finish_time`` and ``state.unique_live``, set by every write after ``derive``.

    * ``finish_time``: when the task became terminal (succeeded, failed, expired, cancelled): the
      write's ``now`` the first time, kept by later writes; None while it is pending or running
      (a restart or a reset clears it). Retention counts from it. A parent (``children``: its
      ``state.children`` summary) whose status is terminal while a child is still pending or
      running (a sequential child blocked behind one that failed) has none yet: retention must
      not remove a parent and leave its children behind.
    * ``unique_live``: the task's ``unique_hash`` (``unique_by="params"``) while it is pending or
      running, else None: a unique partial index over it lets one live task hold a params hash.
    """
    done = status in TERMINAL and not (children and any(c["status"] in LIVE for c in children))
    return {
        "finish_time": (finish_time or now) if done else None,
        "unique_live": unique_hash if status in LIVE else None,
    }
