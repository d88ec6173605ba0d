"""The storage seam: named domain operations, each with a params object and an explicit ``now``.

Publisher, Consumer, CLI and web call these operations only; ``MongoDriver`` is the one module
that knows collection names, filters, updates, indexes and change-stream options, and
``MemoryDriver`` implements the same semantics in process. ``tests/conformance`` runs one suite
against every driver.

Rules every driver keeps:

* A claim is atomic and its filter enforces every rule: a free slot (capacity), the allow-list
  (``specific_worker_ids``), this worker holds no running entry and has not succeeded on the
  task, the retry budget is not used, and the task is due (``claim_at <= now``). Order: priority
  desc, tasks aimed at this worker first, due time asc.
* Every write about an attempt matches ``(key, worker_id, attempt)`` and a running entry
  (fencing): a worker that lost its lease cannot change the task.
* A ping never revives an expired lease; ``expire_leases`` marks expired entries lost, which frees
  their slots and counts against the retry budget.
* Derived fields (``mscheduler.state``) are recomputed by every write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from mscheduler.state import derive


@dataclass(slots=True, frozen=True)
class NewTask:
    """A validated task to insert (built by the Publisher from ``Task``)."""

    key: str
    name: str
    params: Any
    option: dict[str, Any]  # storage form, see TaskOption.to_storage


@dataclass(slots=True, frozen=True)
class InsertParams:
    tasks: Sequence[NewTask]
    now: datetime
    reset_finished: bool = False
    session: Any = None


@dataclass(slots=True, frozen=True)
class ClaimParams:
    worker_id: str
    names: Sequence[str]
    now: datetime
    attempts: Sequence[str]  # fresh attempt tokens; at most len(attempts) tasks are claimed
    # The first lease is the task's own worker_timeout from ``now`` (computed by the store from
    # the stored option, inside the claim), capped by ``max_lease`` if given.
    max_lease: timedelta | None = None
    host: str | None = None
    pid: int | None = None
    # keys this worker still tracks (running, or outcome not yet written): never claimed again
    exclude_keys: Sequence[str] = ()


@dataclass(slots=True, frozen=True)
class ClaimedTask:
    key: str
    name: str
    params: Any
    option: dict[str, Any]
    attempt: str
    attempt_no: int  # 1-based position among this task's entries
    ping_expire_time: datetime
    fail_cnt: int = 0  # failures counted against the budget before this attempt
    failure_times: tuple[datetime, ...] = ()  # when those failures happened, oldest first


@dataclass(slots=True, frozen=True)
class PingParams:
    worker_id: str
    now: datetime
    # expire time -> {key: attempt}; one write per distinct lease length (usually one)
    groups: Mapping[datetime, Mapping[str, str]]


@dataclass(slots=True)
class PingResult:
    alive: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> current option
    lost: list[str] = field(default_factory=list)  # entry gone, finished or expired
    revoked: list[str] = field(default_factory=list)  # still ours, but no longer allowed
    cancelled: list[str] = field(default_factory=list)  # still ours, but the task was cancelled


@dataclass(slots=True, frozen=True)
class FinishParams:
    key: str
    worker_id: str
    attempt: str
    now: datetime
    outcome: str  # an AttemptStatus value other than running / lost
    result: Any = None
    error: dict[str, Any] | None = None
    retry_at: datetime | None = None  # for failures and snoozes: when the task may run again
    final: bool = False  # a failure that ends the task (the handler raised Fail)


@dataclass(slots=True, frozen=True)
class ExpireParams:
    now: datetime


@dataclass(slots=True, frozen=True)
class WakeupParams:
    worker_id: str
    names: Sequence[str]
    now: datetime
    limit: int = 100


@dataclass(slots=True, frozen=True)
class Wakeup:
    """A time at which a known task may become claimable (``kind``: claim or lease)."""

    key: str
    time: datetime
    kind: str


@dataclass(slots=True, frozen=True)
class ChangeEvent:
    """A task changed: what a consumer needs to schedule a wake-up, without another read.

    ``claimers`` (``state.claimers``) says who may claim it now; when it is known and non-empty
    but ``claim_at`` is None, the claim time did not change in this write (it is due now or at a
    time the consumer already knows). ``lease_expiry`` is known only where the store delivers
    whole documents (the memory driver); the Mongo driver's stream carries only changed fields.
    """

    key: str
    name: str
    claim_at: datetime | None
    lease_expiry: datetime | None
    specific_worker_ids: tuple[str, ...]
    token: Any = None
    claimers: tuple[str, ...] | None = None
    # False when the store reported only the array elements that changed: the listed workers
    # may claim, others may too (so nobody should drop a wake-up because of this event)
    claimers_complete: bool = True


@dataclass(slots=True, frozen=True)
class StreamPosition:
    """No matching change, but the stream moved on: keep ``token`` to resume from here (the
    post-batch resume token), so a reopen does not replay or miss the events in between."""

    token: Any


@dataclass(slots=True, frozen=True)
class UpdateOptionParams:
    key: str
    option: dict[str, Any]  # full storage form after the change
    now: datetime


@dataclass(slots=True, frozen=True)
class ControlParams:
    """An operator's change of one task, a compare-and-set on its status: applied only while
    ``state.status`` is one of ``statuses``. ``action``: ``cancel`` (sets ``state.cancelled`` to
    {reason, time}), ``pause`` / ``resume`` (sets ``state.paused``), ``remove`` (deletes the
    document), ``restart`` (moves the attempt entries to ``state.history``, clears cancelled /
    expired / broken / paused: a new generation with a fresh budget)."""

    key: str
    action: str
    statuses: Sequence[str]
    now: datetime
    reason: str = ""


CONTROL_ACTIONS = ("cancel", "pause", "resume", "remove", "restart")


@dataclass(slots=True, frozen=True)
class ListParams:
    status: str | None = None
    name: str | None = None
    limit: int = 100
    skip: int = 0


@dataclass(slots=True, frozen=True)
class InsertPlanParams:
    """A new plan's stored document (``Plan.to_storage``); an existing ``plan_id`` is not replaced."""

    plan: Mapping[str, Any]
    now: datetime


@dataclass(slots=True, frozen=True)
class PlanListParams:
    state: str | None = None
    limit: int = 100
    skip: int = 0


@dataclass(slots=True, frozen=True)
class UpdatePlanParams:
    """Set ``fields`` of a plan if its stored ``version`` is still ``version`` (compare-and-set);
    ``fields`` holds the new ``version`` too."""

    plan_id: str
    version: int
    fields: Mapping[str, Any]
    now: datetime


@dataclass(slots=True, frozen=True)
class DuePlansParams:
    """Plans a planner should look at: active or awaiting completion, ``due_time <= now``."""

    now: datetime
    limit: int = 500


@dataclass(slots=True, frozen=True)
class PlanAdvance:
    """One compare-and-set of a planner: matches ``plan_id``, the ``version`` and the
    ``next_fire_time`` it read; sets ``fields`` (new progress and version)."""

    plan_id: str
    version: int
    next_fire_time: datetime | None
    fields: Mapping[str, Any]


@dataclass(slots=True, frozen=True)
class AdvancePlansParams:
    advances: Sequence[PlanAdvance]
    now: datetime


@dataclass(slots=True, frozen=True)
class RunOutcome:
    """What a planner needs of a plan's run task: its status and when its last attempt ended."""

    key: str
    status: str
    end_time: datetime | None


@dataclass(slots=True, frozen=True)
class WorkerInfo:
    worker_id: str
    host: str
    pid: int
    names: Sequence[str]
    concurrency: int
    start_time: datetime


class ChangeStreamUnsupported(Exception):
    """The backend cannot watch (standalone server, mongomock): the consumer polls instead."""


class ResumeTokenLost(Exception):
    """The stream cannot resume from the given token (history lost, token invalid): reopen
    without a token and poll once, since events in between may be missed."""


@runtime_checkable
class Driver(Protocol):
    """Named domain operations over the task store."""

    async def setup(self) -> None: ...

    async def server_time(self) -> datetime | None: ...

    async def insert_tasks(self, params: InsertParams) -> list[bool]: ...

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]: ...

    async def ping(self, params: PingParams) -> PingResult: ...

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]: ...

    async def expire_leases(self, params: ExpireParams) -> int:
        """Mark expired running entries lost; returns how many tasks changed."""
        ...

    async def expire_deadlines(self, params: ExpireParams) -> int:
        """Mark pending tasks whose deadline passed ``expired``; returns how many."""
        ...

    async def find_wakeups(self, params: WakeupParams) -> list[Wakeup]: ...

    def watch(
        self, names: Sequence[str], resume_token: Any = None
    ) -> AsyncIterator[ChangeEvent | StreamPosition]:
        """Change events for tasks with these names; raises ChangeStreamUnsupported, or
        ResumeTokenLost when ``resume_token`` cannot be used."""
        ...

    async def get_task(self, key: str) -> dict[str, Any] | None: ...

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]: ...

    async def count_by_status(self) -> dict[str, int]: ...

    async def control_task(self, params: ControlParams) -> bool:
        """One atomic operator change (see ControlParams); False when no task with that key is
        in one of the allowed statuses (nothing changed)."""
        ...

    async def update_option(self, params: UpdateOptionParams) -> bool: ...

    async def register_worker(self, info: WorkerInfo) -> None: ...

    async def heartbeat_worker(self, worker_id: str, now: datetime, running_cnt: int) -> bool: ...

    async def request_worker_stop(self, worker_id: str, now: datetime) -> bool: ...

    async def unregister_worker(self, worker_id: str, now: datetime) -> None: ...

    async def list_workers(self) -> list[dict[str, Any]]: ...

    # -- plans (mscheduler.plans; their own collection) ----------------------------------------

    async def insert_plan(self, params: InsertPlanParams) -> bool:
        """False (nothing written) if a plan with that id exists."""
        ...

    async def get_plan(self, plan_id: str) -> dict[str, Any] | None: ...

    async def list_plans(self, params: PlanListParams) -> list[dict[str, Any]]:
        """Plans in creation order (then id), optionally of one state."""
        ...

    async def update_plan(self, params: UpdatePlanParams) -> bool:
        """Compare-and-set on ``version``; False if the plan is gone or changed meanwhile."""
        ...

    async def delete_plan(self, plan_id: str) -> bool: ...

    async def find_due_plans(self, params: DuePlansParams) -> list[dict[str, Any]]:
        """Up to ``limit`` plans a planner should look at now, earliest ``due_time`` first."""
        ...

    async def advance_plans(self, params: AdvancePlansParams) -> int:
        """Apply the compare-and-sets (one bulk write); returns how many matched."""
        ...

    async def get_run_outcomes(self, keys: Sequence[str]) -> dict[str, RunOutcome]:
        """Status and last end time of these tasks (one read); missing keys are left out."""
        ...


def new_task_document(task: NewTask, now: datetime) -> dict[str, Any]:
    """The stored form of a new task, derived fields included."""
    state: dict[str, Any] = {"create_time": now, "update_time": now, "worker_states": []}
    state.update(derive(task.name, task.option, []))
    return {
        "key": task.key,
        "name": task.name,
        "params": task.params,
        "option": dict(task.option),
        "state": state,
    }


def first_lease_end(params: ClaimParams, option: Mapping[str, Any]) -> datetime:
    """When a new claim's lease ends: ``now + worker_timeout``, capped by ``max_lease``."""
    lease = timedelta(milliseconds=option["worker_timeout_ms"])
    if params.max_lease is not None:
        lease = min(lease, params.max_lease)
    return params.now + lease


def new_entry(params: ClaimParams, attempt: str, expire: datetime) -> dict[str, Any]:
    """A running worker entry; every field is present (explicit nulls) on purpose."""
    return {
        "worker_id": params.worker_id,
        "attempt": attempt,
        "host": params.host,
        "pid": params.pid,
        "status": "running",
        "start_time": params.now,
        "ping_expire_time": expire,
        "end_time": None,
        "retry_at": None,
        "result": None,
        "error": None,
        "final": False,  # True: the handler said Fail, no more retries
    }


ENTRY_FIELDS = (
    "worker_id",
    "attempt",
    "host",
    "pid",
    "status",
    "start_time",
    "ping_expire_time",
    "end_time",
    "retry_at",
    "result",
    "error",
    "final",
)


FAILURE_STATUSES = ("failed", "lost", "rejected")


def failure_times(worker_states: Sequence[Mapping[str, Any]]) -> tuple[datetime, ...]:
    """When the counted failures of a task happened, oldest first (for retry policies)."""
    return tuple(
        sorted(e["end_time"] for e in worker_states if e["status"] in FAILURE_STATUSES and e.get("end_time"))
    )


def lost_retry_at(option: Mapping[str, Any], fail_cnt: int, now: datetime) -> datetime:
    """When a task whose lease was just lost may run again: the policy's delay for failure
    ``fail_cnt + 1`` from ``option.lost_retry_delays_ms`` (see model.lost_retry_delays_ms)."""
    delays = option.get("lost_retry_delays_ms") or [0]
    return now + timedelta(milliseconds=delays[min(fail_cnt, len(delays) - 1)])


def encoded_size(value: Any) -> int:
    """Bytes ``value`` takes in a stored document (BSON), to enforce the params / result caps."""
    import bson

    return len(bson.encode({"v": value}))


def allowed(option: Mapping[str, Any], worker_id: str) -> bool:
    ids = option["specific_worker_ids"]
    return not ids or worker_id in ids


def event_for(doc: Mapping[str, Any], token: Any = None) -> ChangeEvent:
    state = doc["state"]
    running = [e["ping_expire_time"] for e in state["worker_states"] if e["status"] == "running"]
    return ChangeEvent(
        key=doc["key"],
        name=doc["name"],
        claim_at=state.get("claim_at"),
        lease_expiry=min(running) if running else None,
        specific_worker_ids=tuple(doc["option"]["specific_worker_ids"]),
        token=token,
        claimers=tuple(state.get("claimers", ())),
    )
