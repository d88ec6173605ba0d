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
* Derived fields (``mscheduler.domain.state``) are recomputed by every write.

The params and results built per task and per write on the hot path (``NewTask``,
``ClaimedTask``, ``FinishParams``, ``ChangeEvent``) are slotted dataclasses that are
not frozen, read-only by convention: a frozen dataclass's ``__init__`` costs three times a plain
one's.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.fairness import KeyWait
from mscheduler.domain.family import MapExpansion
from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import GROUP_PREFIX
from mscheduler.domain.partitions import part_of, visit_order
from mscheduler.domain.state import derive, family_inputs, lifecycle, stopped_by_pause
from mscheduler.domain.stats import StatsStep, TaskStats


@dataclass(slots=True)
class NewTask:
    """A validated task to insert (built by the Publisher from ``Task``)."""

    key: str
    name: str
    params: Any
    option: dict[str, Any]  # storage form, see TaskOption.to_storage
    # ``Task(unique_by="params")``: the hash of name + params (mscheduler.domain.unique.params_hash); no
    # second live task with the same hash is created
    unique_hash: str | None = None
    # Child tasks (mscheduler.services.children): a parent's definition {mode, names, keys}; a child's
    # parent key and position, and whether it waits for the child before it (sequential mode).
    children: Mapping[str, Any] | None = None
    parent: str | None = None
    position: int | None = None
    blocked: bool = False
    # Workflows: a step's needs [{name, key}] (its handler reads their results at the claim); a
    # map step's {over, on_failure, max_items} (fanned out once ``over`` succeeded)
    needs: Sequence[Mapping[str, str]] | None = None
    map: Mapping[str, Any] | None = None
    # The sender's W3C trace context (mscheduler.observability.tracing), stored as the top-level ``trace``:
    # apart from params and options, so no hash and no claim filter sees it.
    trace: Mapping[str, str] | None = None
    # A plan's run: the plan that made it (stored as the top-level ``plan_id``): a planner that
    # finds its run's key held by a task without it did not make that task, and does not adopt it
    plan_id: str | None = None


DEFAULT_MAX_ENTRIES = 100
# Earlier generations a task keeps in ``state.history`` (a restart adds one): with at most
# ``max_entries`` entries each, a task restarted for ever stays a bounded document.
MAX_HISTORY = 20


@dataclass(slots=True, frozen=True)
class InsertParams:
    """Tasks to insert. ``reset_finished``: a task that ended (succeeded or failed) is reset to
    pending with the new params and option, its attempts kept in ``state.history`` as an
    earlier generation (``{generation, restart_time, worker_states, action: "reset", by}``).
    ``by``: who sends (an API token's ``api:<name>``, a caller's own words): in the ``sent``
    events and a reset's history record."""

    tasks: Sequence[NewTask]
    now: datetime
    reset_finished: bool = False
    session: Any = None
    by: str | None = None


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
    # entries a task keeps: a claim that appends beyond it drops the oldest entries that do not
    # count (released, revoked, snoozed; see trim_entries)
    max_entries: int = DEFAULT_MAX_ENTRIES
    groups: Sequence[str] = ()  # the worker's groups: tasks aimed at them are claimable
    # filled by the driver with the attempts whose claim outcome is unknown while others were
    # claimed (an error after the store may have applied it): the flow limiter keeps their slots
    uncertain: list[str] | None = None
    # the partitions to visit, in order (those the claimer knows to have work, from a random
    # one: ``mscheduler.domain.partitions.visit_order``); None: every partition, the driver's order
    parts: Sequence[int] | None = None
    # the lanes (fairness keys; None: tasks without one) to claim from, in the order of the
    # claimer's rotation (``mscheduler.domain.fairness``): the attempts are dealt over them in
    # turn, a lane listed twice takes two turns (its weight); a claim reads one lane's tokens
    lanes: Sequence[str | None] = (None,)
    # filled by the driver with the lanes where a claim found nothing (in every partition it
    # visited): the rotation leaves them until they are found again
    exhausted: list[str | None] | None = None

    def __post_init__(self) -> None:
        _check_claimer(self.worker_id)


@dataclass(slots=True)
class ClaimedTask:
    key: str
    name: str
    params: Any
    option: dict[str, Any]  # read only (the memory driver hands over its stored option)
    attempt: str
    attempt_no: int  # 1-based position among this task's entries
    ping_expire_time: datetime
    fail_cnt: int = 0  # failures counted against the budget before this attempt
    failure_times: tuple[datetime, ...] = ()  # when those failures happened, oldest first
    checkpoint: Any = None  # ``state.checkpoint.data`` as the claim found it (an earlier attempt's)
    parent: str | None = None  # a child task's parent key (its finish is followed by a sync)
    due_time: datetime | None = None  # when it became claimable (see ``due_time``): queue wait
    trace: Mapping[str, str] | None = None  # the sender's trace context (mscheduler.observability.tracing)
    # the flow limit whose slot this attempt holds (set by the consumer's limiter on the claim's
    # new objects, before anyone else sees them)
    slot: str | None = None
    generation: int = 0  # the task's generation (``state.generation``: restarts and resets count)
    # a workflow step's needs [{name, key}]: their results are read before its handler runs
    needs: Sequence[Mapping[str, str]] | None = None
    lane: str | None = None  # its fairness key (``option.fair_key``): the lane it was claimed from
    claim_priority: int = 0  # the priority the claim ordered it by (``state.claim_priority``)


@dataclass(slots=True, frozen=True)
class AttemptReport:
    """What a handler asked to record with the next ping of its attempt: a checkpoint
    (``save_checkpoint``; ``checkpoint`` is its data, None included) and / or its progress
    (``{"fraction", "message"}``). ``seq`` numbers the reports of one attempt: the stored
    ``state.checkpoint`` / ``state.progress`` carry it, so a read-back tells whether this one
    landed."""

    seq: int
    save_checkpoint: bool = False
    checkpoint: Any = None
    progress: Mapping[str, Any] | None = None


@dataclass(slots=True, frozen=True)
class PingParams:
    worker_id: str
    now: datetime
    # expire time -> {key: attempt}; one write per distinct lease length (usually one)
    groups: Mapping[datetime, Mapping[str, str]]
    # key -> what to record on the task with this ping (fenced like the ping itself); the ping
    # stays one write command (a bulk write of per-task updates when there are reports)
    reports: Mapping[str, AttemptReport] = field(default_factory=dict)
    worker_groups: Sequence[str] = ()  # still allowed if one of them is named


@dataclass(slots=True)
class PingResult:
    alive: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> current option
    lost: list[str] = field(default_factory=list)  # entry gone, finished or expired
    revoked: list[str] = field(default_factory=list)  # still ours, but no longer allowed
    cancelled: list[str] = field(default_factory=list)  # still ours, but the task was cancelled
    # told to stop by an operator's ``pause(stop_running=True)`` (not renewed): stop the handler,
    # then settle the attempt ``released`` (not a failure)
    paused: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)  # keys whose report (checkpoint, progress) landed


@dataclass(slots=True)
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
    groups: Sequence[str] = ()
    lanes: Sequence[str | None] = (None,)  # the lanes (fairness keys) whose tasks to read

    def __post_init__(self) -> None:
        _check_claimer(self.worker_id)


@dataclass(slots=True, frozen=True)
class KeyWaitParams:
    """The fairness keys with due tasks (claimable at ``now``) of ``names`` (None: every name),
    the longest wait first, at most ``limit`` of them."""

    now: datetime
    names: Sequence[str] | None = None
    limit: int = 100


@dataclass(slots=True, frozen=True)
class LaneParams:
    """Which lanes (fairness keys) hold tasks of ``names`` that are claimable (now or later):
    at most ``limit`` keys, in key order, after ``after`` (a page). The lane of the tasks without
    a key is not listed (a claimer always visits it)."""

    names: Sequence[str]
    limit: int = 1000
    after: str | None = None


def _check_claimer(worker_id: str) -> None:
    """A worker id starting with ``g:`` would read as a group's claimer token (``name|g:<group>``)
    and claim the tasks aimed at that group: refused before any driver sees it."""
    if worker_id.startswith(GROUP_PREFIX):
        raise InvalidInput(f"worker id {worker_id!r}: must not start with {GROUP_PREFIX!r} (a group's token)")


@dataclass(slots=True, frozen=True)
class Wakeup:
    """A time at which a known task may become claimable (``kind``: claim or lease), or its
    deadline (``kind``: deadline: the deadline pass marks it expired then if it has not started)."""

    key: str
    time: datetime
    kind: str
    lane: str | None = None  # the task's fairness key (a claim wake-up's lane)


@dataclass(slots=True)
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
    # An operator asked the running attempts to stop (``state.stop``): "cancel" or "pause"
    # ("unknown" when the store did not say which). ``stop_attempts``: the attempt tokens that
    # were running; None when not known (the consumer running the task then pings at once).
    stop: str | None = None
    stop_attempts: tuple[str, ...] | None = None
    # the task's deadline, where the store delivered its option (inserts, the memory driver):
    # the consumer runs the deadline pass then (None: none, or not known from this event)
    deadline: datetime | None = None
    # the claim priority (``state.claim_priority``), where the store delivered it (inserts, the
    # memory driver): the fairness rotation learns a lane's head priority from it
    priority: int | None = None


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
    by: str | None = None  # who edited it (the ``edited`` event's detail), when known


@dataclass(slots=True, frozen=True)
class ControlParams:
    """An operator's change of one task, a compare-and-set on its status: applied only while
    ``state.status`` is one of ``statuses``. ``action``: ``cancel`` (sets ``state.cancelled`` to
    {reason, time, by}), ``pause`` / ``resume`` (sets ``state.paused``), ``remove`` (deletes the
    document), ``restart`` (moves the attempt entries to ``state.history``, clears cancelled /
    expired / broken / paused, the checkpoint and progress: a new generation with a fresh budget).

    ``cancel`` and a ``pause`` with ``stop_running`` also set ``state.stop`` to {action, time,
    attempts} when attempts are running (else null): the change stream passes that field, so the
    consumers running them stop their handlers at once (``ChangeEvent.stop``). Those attempts stay
    running (holding their slots) until settled — ``cancelled``, or ``released`` for a pause — by
    their workers once the handlers stopped, or by the lease pass at their lease's end
    (``settlement``). A ``restart`` is refused (None) while an attempt of any generation holds a
    live lease; running entries whose leases ended are settled first, never moved to the
    history running."""

    key: str
    action: str
    statuses: Sequence[str]
    now: datetime
    reason: str = ""
    # pause only: also stop the running attempts, in the same write: their entries become
    # ``released`` (error type PAUSED, not counted against the budget) and ``state.stop`` is set
    stop_running: bool = False
    # who did it (an API token's ``api:<name>``): in the event's detail and ``state.cancelled``
    by: str | None = None
    # restart only: the new generation's deadline (None: the old one, dropped if already past)
    deadline: datetime | None = None


CONTROL_ACTIONS = ("cancel", "pause", "resume", "remove", "restart")


def control_detail(params: ControlParams) -> dict[str, Any] | None:
    """The detail of a control's event: its reason and author, when given."""
    detail = {name: value for name, value in (("reason", params.reason), ("by", params.by)) if value}
    return detail or None


def cancelled_record(params: ControlParams) -> dict[str, Any]:
    """``state.cancelled`` of a cancel: {reason, time} and ``by`` when known."""
    record: dict[str, Any] = {"reason": params.reason, "time": params.now}
    if params.by:
        record["by"] = params.by
    return record


@dataclass(slots=True, frozen=True)
class StatsParams:
    """What ``task_stats`` computes (definitions: ``mscheduler.domain.stats``): counts by name and
    status with the oldest due pending task per name (one aggregation); with a ``window``, also
    the tasks finished in it and the last hour's throughput (one more). ``names`` /
    ``statuses``: only these (None: all)."""

    now: datetime
    window: timedelta | None = None
    names: Sequence[str] | None = None
    statuses: Sequence[str] | None = None


@dataclass(slots=True, frozen=True)
class InsertEventsParams:
    """Events to store (``mscheduler.domain.events.event_doc``); ``now`` becomes their
    ``written`` time. Ids already stored are skipped (a retried write is harmless)."""

    events: Sequence[Mapping[str, Any]]
    now: datetime
    session: Any = None


@dataclass(slots=True, frozen=True)
class EventQuery:
    """Which events to read (``list_events``) or follow (``open_event_stream``). Empty sequences
    mean "any". Reads are in ``(time, id)`` order, or ``(written, id)`` with ``by_written`` (the
    order a poller follows: ``written_from`` and ``after`` bound it)."""

    keys: Sequence[str] = ()
    names: Sequence[str] = ()
    kinds: Sequence[str] = ()
    plan_ids: Sequence[str] = ()
    worker_id: str | None = None
    time_from: datetime | None = None  # event time >= this
    time_to: datetime | None = None  # event time < this
    written_from: datetime | None = None
    after: tuple[datetime, str] | None = None  # (written, id): strictly after this position
    by_written: bool = False
    skip: int = 0
    limit: int = 100


class EventStream(Protocol):
    """An open stream of new events (stored form), in the order they were stored.
    ``resume_token``: where to reopen from (after the last event read)."""

    resume_token: Any

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    async def aclose(self) -> None: ...


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
    plan_id: str | None = None  # the plan that made the task (None: a task no plan made)


@dataclass(slots=True, frozen=True)
class WorkerInfo:
    worker_id: str
    host: str
    pid: int
    names: Sequence[str]
    concurrency: int
    start_time: datetime
    groups: Sequence[str] = ()  # the worker groups it serves, shown by ``workers ls``
    # (name, JSON schema of its params as JSON text) for each handler with a params model: what
    # a send over the API or the CLI is checked against (``mscheduler.domain.params_schema``)
    schemas: Sequence[tuple[str, str]] = ()


DEFAULT_WORKER_RETENTION = timedelta(days=1)
WORKERS_PAGE_MAX = 1000


@dataclass(slots=True, frozen=True)
class WorkerListParams:
    """Which registered workers to read (``list_workers``). A registration not seen for the
    store's ``worker_retention`` (stopped, or silent: a process that died) is gone: the store
    expires it (a TTL index on ``last_seen``) and no listing shows it meanwhile. With ``now``
    None the retention is not applied (every registration kept so far).

    ``live_since``: only workers not stopped and seen since then (any order; the metrics' and the
    publisher's read, on the index ``workers_live``). Otherwise a page in ``(start_time,
    worker_id)`` order after ``after`` (index ``workers_list``), at most ``limit``. ``schemas``:
    with each worker's published params schemas (``schemas``: a list of ``{name, schema}``);
    otherwise left out of what is read."""

    now: datetime | None = None
    live_since: datetime | None = None
    after: tuple[datetime, str] | None = None
    limit: int = WORKERS_PAGE_MAX
    schemas: bool = False


@dataclass(slots=True, frozen=True)
class RetentionParams:
    """How long finished tasks are kept, per terminal status (None: for ever); see
    ``mscheduler.services.retention.Retention``."""

    periods: Mapping[str, timedelta | None]


@dataclass(slots=True, frozen=True)
class PurgeParams:
    """Delete up to ``limit`` tasks in ``status`` whose ``state.finish_time`` is at or before
    ``before`` (the oldest first). Children are never deleted alone: a parent goes with its
    children (deleted first), and a parent has a finish time only once none of them is live."""

    status: str
    before: datetime
    limit: int = 1000


class UniqueParamsTaken(Exception):
    """A write would make a second live task with the same params hash (``unique_by="params"``):
    refused, nothing changed. ``holder``: the live task's key, where the store said it."""

    def __init__(self, key: str, holder: str | None = None) -> None:
        super().__init__(f"task {key!r}: a live task{f' ({holder!r})' if holder else ''} has the same params")
        self.key = key
        self.holder = holder


@dataclass(slots=True, frozen=True)
class SyncParentsParams:
    """Bring these parents' ``state.children`` summaries up to date from their children's
    documents and unblock the next child of a sequential parent (``mscheduler.services.children``)."""

    keys: Sequence[str]
    now: datetime


@dataclass(slots=True, frozen=True)
class SyncOutcome:
    """What ``sync_parents`` did and left to its caller (``mscheduler.publishing.sync_families``):
    how many parents changed, the map steps to fan out, and the parents of changed parents that
    are children themselves (a fanned-out map step's workflow), to sync next."""

    changed: int
    expand: Sequence[MapExpansion] = ()
    cascade: Sequence[str] = ()


@dataclass(slots=True, frozen=True)
class StepResult:
    """A workflow step as a step that needs it reads it (``read_results``): its status and its
    result (a map step's: the results of its items that succeeded, in the items' order)."""

    status: str
    result: Any = None


@dataclass(slots=True, frozen=True)
class ExpandMapParams:
    """Record a map step as fanned out into ``count`` items (inserted before): a compare-and-set
    on the step not being fanned out yet; it then takes its status from its items."""

    key: str
    count: int
    on_failure: str
    now: datetime


@dataclass(slots=True, frozen=True)
class ResetStepsParams:
    """Workflow steps to run again (``Operations.restart_step``), restarted before: each is
    blocked until its needs succeed again; a map step is no longer fanned out and its items are
    removed."""

    keys: Sequence[str]
    now: datetime


@dataclass(slots=True, frozen=True)
class OpenParentsParams:
    """Keys of unfinished parents (pending or running) in key order, strictly after ``after``."""

    after: str | None = None
    limit: int = 500


@dataclass(slots=True, frozen=True)
class MarkParams:
    """An operator sets a task's status by hand (``state.marked`` {status, reason, by, time}):
    a compare-and-set on ``state.status`` being one of ``statuses`` and nothing running; never a
    parent (its status follows from its children)."""

    key: str
    status: str
    statuses: Sequence[str]
    now: datetime
    reason: str = ""
    by: str = ""


@dataclass(slots=True, frozen=True)
class LimitOfName:
    """The limit that covers a task name (``limit_keys``): its key, and whether it has a rate (a
    consumer keeps no reserved grants of a rated limit: they would start tasks without counting)."""

    key: str
    rated: bool = False


@dataclass(slots=True, frozen=True)
class PutLimitParams:
    """Create or change the limit ``key`` (``Limit.to_storage`` fields); its slots and starts are
    kept. A name that another limit covers is refused (``LimitNameTaken``)."""

    key: str
    fields: Mapping[str, Any]
    now: datetime


@dataclass(slots=True, frozen=True)
class AcquireParams:
    """Grant concurrency slots (and rate starts) of limit ``key`` to ``attempts`` of ``worker_id``,
    each slot leased until ``expire`` (see ``mscheduler.domain.limits.grant``). Idempotent by attempt.
    ``release``: slots of this worker's attempts that ended, released in the same write (before
    the grant, so they count as free; their starts stay counted) - what ``update_slots(release=)``
    would do, without a write of its own."""

    key: str
    worker_id: str
    attempts: Sequence[str]
    now: datetime
    expire: datetime
    release: Sequence[str] = ()


@dataclass(slots=True, frozen=True)
class AcquireResult:
    """``granted``: the attempts that hold a slot (in asked order); ``limited``: False when no
    such limit exists (nothing to hold: the caller claims as if unlimited); ``retry_at``: when the
    rate window frees a start, if the rate is what refused."""

    granted: list[str]
    limited: bool = True
    retry_at: datetime | None = None
    # the limit after the grant: live slots, its max_running, whether it has a rate
    live: int = 0
    max_running: int | None = None
    rate: bool = False


@dataclass(slots=True, frozen=True)
class SlotsParams:
    """Change this worker's slots of limit ``key`` (``mscheduler.domain.limits.settle``): ``extend``
    moves live slots' expiry (the pinger, before it renews the leases; after a claim, to the
    task's first lease); ``release`` frees slots (the attempt ended); ``unused`` frees grants the
    claim did not use, with their rate starts."""

    key: str
    worker_id: str
    now: datetime
    extend: Mapping[str, datetime] = field(default_factory=dict)
    release: Sequence[str] = ()
    unused: Sequence[str] = ()


class LimitNameTaken(Exception):
    """A limit would cover a task name another limit covers: refused, nothing changed."""

    def __init__(self, key: str, name: str | None = None, holder: str | None = None) -> None:
        which = f"name {name!r}" if name else "one of its names"
        owner = f" (limit {holder!r})" if holder else ""
        super().__init__(f"limit {key!r}: {which} is covered by another limit{owner}")
        self.key = key
        self.name = name
        self.holder = holder


class ChangeStreamUnsupported(Exception):
    """The backend cannot watch (a standalone server): the consumer polls instead."""


class ResumeTokenLost(Exception):
    """The stream cannot resume from the given token (history lost, token invalid): reopen
    without a token and poll once, since events in between may be missed."""


@runtime_checkable
class Driver(Protocol):
    """Named domain operations over the task store."""

    @property
    def partitions(self) -> int:
        """The store's number of partitions (``mscheduler.domain.partitions``; 1: unpartitioned),
        as the store recorded it: a driver reads it before acting on a task."""
        ...

    async def setup(self) -> None:
        """Make the store ready (an administrator's step: ``mscheduler setup``): create the
        indexes, rebuilding those whose spec changed since an earlier build."""
        ...

    async def prepare(self) -> None:
        """What a consumer, publisher or server does before its first operation: learn what the
        store can do and check that it is set up; a store that is not raises a configuration
        ``StorageError`` naming what is missing (``mscheduler setup`` makes it)."""
        ...

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

    async def find_lanes(self, params: LaneParams) -> list[str]:
        """The fairness keys of claimable tasks of these names (see ``LaneParams``)."""
        ...

    def watch(
        self, names: Sequence[str], resume_token: Any = None
    ) -> AsyncIterator[ChangeEvent | StreamPosition]:
        """Change events for tasks with these names; raises ChangeStreamUnsupported, or
        ResumeTokenLost when ``resume_token`` cannot be used."""
        ...

    async def get_task(self, key: str) -> dict[str, Any] | None: ...

    async def get_tasks(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The tasks with these keys (one read); missing keys are left out."""
        ...

    async def ensure_retention(self, params: RetentionParams) -> bool:
        """Make the store expire finished tasks by itself where it can (TTL indexes on a real
        server, changed when the periods change); False where it cannot (the retention pass is
        then the mechanism)."""
        ...

    async def purge_finished(self, params: PurgeParams) -> int:
        """Delete finished tasks past their retention (see PurgeParams); returns how many."""
        ...

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]: ...

    async def count_tasks(self, params: ListParams, cap: int) -> int:
        """How many tasks the listing's filters select (its order, cursor and limit are
        ignored), counting at most ``cap``: ``cap`` means "``cap`` or more"."""
        ...

    async def count_by_status(self) -> dict[str, int]: ...

    async def key_waits(self, params: KeyWaitParams) -> list[KeyWait]:
        """Per fairness key, its due tasks and the oldest one's wait (see ``KeyWaitParams``)."""
        ...

    async def task_stats(self, params: StatsParams, on_step: StatsStep | None = None) -> TaskStats:
        """Statistics (see StatsParams); ``on_step`` is called before each read of the store."""
        ...

    async def control_task(self, params: ControlParams) -> dict[str, Any] | None:
        """One atomic operator change (see ControlParams): the task as that write left it (for
        ``remove``: as it was deleted), so the caller needs no second read that a later change
        could race; None when no task with that key is in one of the allowed statuses (nothing
        changed)."""
        ...

    async def update_option(self, params: UpdateOptionParams) -> bool: ...

    async def register_worker(self, info: WorkerInfo) -> bool:
        """Register (or re-register) a worker; True when a stop is pending for it. A registration
        that has not ended (no ``stop_time``: e.g. an executor another API server registered)
        keeps its pending stop, ``start_time`` and running count; a new one, or one after an
        unregistration, starts afresh (no stop)."""
        ...

    async def heartbeat_worker(self, worker_id: str, now: datetime, running_cnt: int) -> bool: ...

    async def request_worker_stop(self, worker_id: str, now: datetime) -> bool: ...

    async def unregister_worker(self, worker_id: str, now: datetime) -> None: ...

    async def list_workers(self, params: WorkerListParams | None = None) -> list[dict[str, Any]]:
        """Registered workers (see ``WorkerListParams``; None: every one kept, oldest first)."""
        ...

    # -- plans (mscheduler.domain.plans; their own collection) ----------------------------------------

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

    # -- events (mscheduler.services.events; their own collection) --------------------------------------

    # When True the store keeps an event log: ``insert_tasks``, ``control_task``,
    # ``update_option`` and the expiry passes record their events in the same operation, and
    # consumers buffer theirs (claims, outcomes) for ``insert_events``.
    record_events: bool

    async def insert_events(self, params: InsertEventsParams) -> int:
        """Store events (one write); returns how many were new (known ids are skipped)."""
        ...

    async def list_events(self, query: EventQuery) -> list[dict[str, Any]]: ...

    async def open_event_stream(self, query: EventQuery, resume_token: Any = None) -> EventStream:
        """Follow newly stored events matching ``query`` (only its filters); the stream is open
        when this returns. Raises ChangeStreamUnsupported (the caller polls ``list_events``), or
        ResumeTokenLost."""
        ...

    # -- child tasks (mscheduler.services.children) ---------------------------------------------------------

    async def sync_parents(self, params: SyncParentsParams) -> SyncOutcome:
        """Recompute the parents' summaries from their children (compare-and-set on
        ``state.children_rev``, re-read and retried when another sync won; a map step's from the
        statuses among its items) and unblock each sequential parent's next child and each
        workflow step whose needs succeeded; returns how many parents changed and what is left
        to do (``SyncOutcome``). Idempotent."""
        ...

    async def read_results(self, keys: Sequence[str]) -> dict[str, StepResult]:
        """The status and result of each workflow step (``StepResult``; a map step's result is
        the list of its succeeded items' results, in order), read from the primary; missing keys
        are left out."""
        ...

    async def expand_map(self, params: ExpandMapParams) -> bool:
        """See ``ExpandMapParams``; False when the step was fanned out already (or is gone)."""
        ...

    async def reset_steps(self, params: ResetStepsParams) -> int:
        """See ``ResetStepsParams``; returns how many steps were reset."""
        ...

    async def count_items(self, key: str) -> dict[str, int]:
        """How many of a map step's items are in each status (an operator's read: index keys
        only, within the admin read time)."""
        ...

    async def find_open_parents(self, params: OpenParentsParams) -> list[str]:
        """Keys of pending or running parents (what a reconciler pass looks at)."""
        ...

    async def mark_task(self, params: MarkParams) -> bool:
        """Set ``state.marked`` (see MarkParams); False when the compare-and-set does not hold."""
        ...

    # -- flow limits (mscheduler.domain.limits; their own collection) ---------------------------------

    async def put_limit(self, params: PutLimitParams) -> bool:
        """Create or change a limit; True if it was created. Raises ``LimitNameTaken``."""
        ...

    async def get_limit(self, key: str) -> dict[str, Any] | None: ...

    async def list_limits(self) -> list[dict[str, Any]]: ...

    async def delete_limit(self, key: str) -> bool: ...

    async def limit_keys(self, names: Sequence[str]) -> dict[str, LimitOfName]:
        """Which limit covers each of these names, and whether it has a rate (names without one
        are left out)."""
        ...

    async def held_slots(self, worker_id: str, attempts: Sequence[str], now: datetime) -> dict[str, str]:
        """Which limit holds a live slot of ``worker_id`` for each of ``attempts`` (attempts
        without one are left out): the store's own record of a slot's owner, for a process that
        did not acquire it (a remote executor's ping or report reaching another API server)."""
        ...

    async def acquire_slots(self, params: AcquireParams) -> AcquireResult: ...

    async def update_slots(self, params: SlotsParams) -> list[str]:
        """Apply ``params`` (one atomic write); returns the attempts of ``extend`` whose slot is
        live afterwards (all of them when the limit no longer exists)."""
        ...


def is_driver(candidate: object) -> bool:
    """Whether ``candidate`` has every operation of ``Driver`` (its methods only):
    ``isinstance(x, Driver)`` reads every member, attributes too, and one may need the store
    (``MongoDriver.partitions`` before its layout is read refuses with a ``StorageError``)."""
    return all(callable(getattr(candidate, name, None)) for name in _DRIVER_OPERATIONS)


_DRIVER_OPERATIONS = tuple(
    name for name in dir(Driver) if not name.startswith("_") and callable(getattr(Driver, name))
)


# one claim of a claim round: (attempt token, partition, lane)
ClaimStep = tuple[str, int, str | None]


async def claim_over_parts(
    params: ClaimParams,
    partitions: int,
    claim_round: Callable[[list[ClaimStep]], Awaitable[Sequence[ClaimedTask | BaseException | None]]],
) -> tuple[list[ClaimedTask], list[BaseException], list[str]]:
    """A claim over lanes and partitions, the one rule of every driver (and the sharding
    benchmark's router). Each attempt takes a lane of ``params.lanes`` in turn (the fairness
    rotation; a lane listed twice takes two turns), then a partition of that lane in turn (the
    partitions to visit: ``params.parts``, or all from a random one); each claim names one
    partition (a sharded cluster's one shard) and one lane. A (lane, partition) where a claim
    found nothing is dropped and its attempt tried again in the lane's other partitions, or, once
    the lane has none left, in the other lanes in turn, until the attempts are used or no place
    has work. ``claim_round(plan)`` claims each ``(attempt, partition, lane)`` and answers, in
    order, the task, None (nothing there) or the error. Returns the tasks, the errors and the
    attempts that met them; the lanes found empty in every partition go to
    ``params.exhausted`` when it is a list."""
    parts = list(params.parts) if params.parts else visit_order(partitions)
    turns = list(params.lanes) or [None]
    lanes = list(dict.fromkeys(turns))
    open_parts = {lane: list(parts) for lane in lanes}
    pending = [(attempt, turns[i % len(turns)]) for i, attempt in enumerate(params.attempts)]
    claimed: list[ClaimedTask] = []
    errors: list[BaseException] = []
    failed: list[str] = []
    dealt: set[str | None] = set()
    while pending:
        live = [lane for lane in lanes if open_parts[lane]]
        if not live:
            break
        plan: list[ClaimStep] = []
        turn_of = dict.fromkeys(lanes, 0)
        for i, (attempt, lane) in enumerate(pending):
            if not open_parts[lane]:  # the lane is empty everywhere: the attempt goes to another
                lane = live[i % len(live)]
            of_lane = open_parts[lane]
            plan.append((attempt, of_lane[turn_of[lane] % len(of_lane)], lane))
            turn_of[lane] += 1
        dealt.update(lane for _, _, lane in plan)
        results = await claim_round(plan)
        pending = []
        for (attempt, part, lane), result in zip(plan, results, strict=True):
            if isinstance(result, ClaimedTask):
                claimed.append(result)
            elif isinstance(result, BaseException):
                errors.append(result)
                failed.append(attempt)
            else:
                if part in open_parts[lane]:
                    open_parts[lane].remove(part)
                pending.append((attempt, lane))
    if params.exhausted is not None:
        params.exhausted.extend(lane for lane in lanes if lane in dealt and not open_parts[lane])
    return claimed, errors, failed


# new_task_document's derived fields by (name, option object), for the tasks of one insert
DerivedByOption = dict[tuple[str, int], tuple[Mapping[str, Any], dict[str, Any]]]


def new_task_document(
    task: NewTask, now: datetime, partitions: int = 1, derived: DerivedByOption | None = None
) -> dict[str, Any]:
    """The stored form of a new task, derived fields included, in its partition (``part``).
    It holds ``task.option`` itself (see below) and ``task.params`` (the memory driver copies
    params it hands out; the Mongo driver sends a copy)."""
    state: dict[str, Any] = {"create_time": now, "update_time": now, "worker_states": []}
    if task.blocked:
        state["blocked"] = True
    if task.children is not None:  # a parent: its children's summary, all pending at first
        names, keys = task.children["names"], task.children["keys"]
        state["children"] = [
            {"name": n, "key": k, "status": "pending"} for n, k in zip(names, keys, strict=True)
        ]
        state["children_rev"] = 0
    if task.blocked or task.children is not None:
        state.update(derive(task.name, task.option, [], **family_inputs(state)))
    elif derived is None:
        state.update(derive(task.name, task.option, []))
    else:
        # A new task of no family: derive's result depends on its name and option alone (no
        # entries, no flags), so the tasks of one insert with the same name and option object
        # take one result (its claimers list shared: derived lists are replaced, never changed)
        held = derived.get((task.name, id(task.option)))
        if held is None or held[0] is not task.option:  # held: the id is not reused meanwhile
            held = derived[(task.name, id(task.option))] = (task.option, derive(task.name, task.option, []))
        state.update(held[1])
    state.update(lifecycle(state["status"], None, task.unique_hash, now))
    doc: dict[str, Any] = {
        "key": task.key,
        "part": part_of(task.key, partitions),
        "name": task.name,
        "params": task.params,
        # not copied: a stored option is never changed in place (a change replaces it), so the
        # memory driver keeps one for all the tasks of a batch sent with the same option
        "option": task.option,
        "unique_hash": task.unique_hash,
        "state": state,
    }
    doc.update(family_fields(task))
    if task.trace:
        doc["trace"] = dict(task.trace)
    if task.plan_id is not None:
        doc["plan_id"] = task.plan_id
    return doc


def reset_record(state: Mapping[str, Any], now: datetime, by: str | None) -> dict[str, Any]:
    """What a reset (``InsertParams.reset_finished``) keeps of the generation it ends, in
    ``state.history``: its attempts, when and by whom it was reset."""
    return {
        "generation": state.get("generation", 0),
        "restart_time": now,
        "worker_states": state["worker_states"],
        "action": "reset",
        "by": by,
    }


def family_fields(task: NewTask) -> dict[str, Any]:
    """The top-level fields of a parent (``children``) or a child (``parent``, ``position``); a
    task of no family is ``solo``: only those expire by the store's TTL indexes (a family is
    removed whole, children first, by the retention pass)."""
    if task.children is not None:
        return {"children": dict(task.children)}
    if task.parent is not None:
        fields: dict[str, Any] = {"parent": task.parent, "position": task.position}
        if task.needs:
            fields["needs"] = [dict(n) for n in task.needs]
        if task.map is not None:
            fields["map"] = dict(task.map)
        return fields
    return {"solo": True}


UNCOUNTED_STATUSES = ("released", "revoked", "snoozed", "cancelled")


def trim_entries(worker_states: list[dict[str, Any]], max_entries: int) -> list[dict[str, Any]]:
    """At most ``max_entries`` entries if dropping the oldest entries that do not count
    (released, revoked, snoozed, cancelled) gets there; running, succeeded and failure entries are never
    dropped (the counts and the retry budget depend on them)."""
    excess = len(worker_states) - max_entries
    if excess <= 0:
        return worker_states
    drop = {id(e) for e in [e for e in worker_states if e["status"] in UNCOUNTED_STATUSES][:excess]}
    return [e for e in worker_states if id(e) not in drop]


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
# ``error.type`` of an entry released by ``pause(stop_running=True)`` (the ping tells it apart)
PAUSED_ERROR = "Paused"


def due_time(doc: Mapping[str, Any]) -> datetime | None:
    """When a task became claimable: ``max(run_at, state.retry_at)``, its ``claim_at`` before a
    claim (a claim changes neither: the new entry has no ``retry_at``)."""
    run_at: datetime | None = doc["option"].get("run_at")
    retry_at: datetime | None = doc["state"].get("retry_at")
    return retry_at if run_at is None or (retry_at is not None and retry_at > run_at) else run_at


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


def allowed(option: Mapping[str, Any], worker_id: str, groups: Sequence[str] = ()) -> bool:
    """May ``worker_id`` (a member of ``groups``) run a task with this option? (a task
    names workers and / or groups; none: anyone.)"""
    ids = option["specific_worker_ids"]
    named_groups = option.get("specific_groups") or ()
    if not ids and not named_groups:
        return True
    return worker_id in ids or any(g in named_groups for g in groups)


def busy_statuses(option: Mapping[str, Any]) -> tuple[str, ...]:
    """Entries of a worker that bar it from claiming the task again: running, and succeeded
    unless ``same_worker_may_repeat``."""
    return ("running",) if option.get("same_worker_may_repeat") is True else ("running", "succeeded")


def stop_record(
    action: str, worker_states: Sequence[Mapping[str, Any]], now: datetime
) -> dict[str, Any] | None:
    """``state.stop`` after a cancel or a stopping pause: who was told to stop (None: nobody ran)."""
    attempts = [e["attempt"] for e in worker_states if e["status"] == "running"]
    return {"action": action, "time": now, "attempts": attempts} if attempts else None


def paused_error() -> dict[str, Any]:
    """The ``error`` of an entry released by ``pause(stop_running=True)``."""
    return {"type": PAUSED_ERROR, "message": "attempt stopped by a pause", "traceback": None}


CANCELLED_ERROR = "Cancelled"


def cancelled_error() -> dict[str, Any]:
    """The ``error`` of an entry settled ``cancelled`` (its task was cancelled while it ran)."""
    return {"type": CANCELLED_ERROR, "message": "the task was cancelled", "traceback": None}


def lost_error() -> dict[str, Any]:
    """The ``error`` of an entry whose lease expired without a word from its worker."""
    return {"type": "LeaseExpired", "message": "the lease expired (no ping)", "traceback": None}


def settlement(state: Mapping[str, Any], attempt: str) -> tuple[str, dict[str, Any]] | None:
    """How an attempt told to stop is settled, whoever writes it (its worker once the handler
    stopped, or the lease pass at its lease's end): ``cancelled`` on a cancelled task,
    ``released`` (error ``Paused``) when ``pause(stop_running=True)`` listed it; None otherwise."""
    if state.get("cancelled") is not None:
        return "cancelled", cancelled_error()
    if stopped_by_pause(state, attempt):
        return "released", paused_error()
    return None


def finish_allowed(state: Mapping[str, Any], attempt: str, outcome: str) -> bool:
    """Does the task's state let this attempt's outcome land (the entry's fence aside)? A cancelled
    task takes only ``cancelled``; an attempt a stopping pause listed only ``released``; any other
    attempt any outcome but ``cancelled``."""
    settled = settlement(state, attempt)
    if settled is None:
        return outcome != "cancelled"
    return outcome == settled[0]


def expired_entry_changes(
    doc: Mapping[str, Any], entry: Mapping[str, Any], now: datetime, fail_cnt: int
) -> dict[str, Any]:
    """What the lease pass writes on a running entry whose lease ended: its settlement when it was
    told to stop (cancelled, or released by a pause: nothing was lost), else ``lost`` with the
    retry time of the task's policy (``fail_cnt``: failures counted before this pass)."""
    settled = settlement(doc["state"], entry["attempt"])
    if settled is not None:
        return {"status": settled[0], "end_time": now, "retry_at": None, "error": settled[1]}
    retry_at = lost_retry_at(doc["option"], fail_cnt, now)
    return {"status": "lost", "end_time": now, "retry_at": retry_at, "error": lost_error()}


def paused_entry(doc: Mapping[str, Any] | None, worker_id: str, attempt: str) -> bool:
    """This worker's attempt was released by an operator's stopping pause (not a lost lease)."""
    for entry in doc["state"]["worker_states"] if doc is not None else ():
        if entry["attempt"] == attempt and entry["worker_id"] == worker_id:
            error = entry.get("error") or {}
            return entry["status"] == "released" and error.get("type") == PAUSED_ERROR
    return False


def report_fields(report: AttemptReport, worker_id: str, attempt: str, now: datetime) -> dict[str, Any]:
    """The ``state`` fields a ping with ``report`` sets: ``checkpoint`` {data, time, worker_id,
    attempt, seq} and / or ``progress`` {fraction, message, time, worker_id, attempt, seq}. Kept
    on the task, not in the entry, so that the next attempt finds them."""
    who = {"time": now, "worker_id": worker_id, "attempt": attempt, "seq": report.seq}
    fields: dict[str, Any] = {}
    if report.save_checkpoint:
        fields["checkpoint"] = {"data": copy.deepcopy(report.checkpoint)} | who
    if report.progress is not None:
        fields["progress"] = {
            "fraction": report.progress["fraction"],
            "message": report.progress.get("message"),
        } | who
    return fields


def event_for(doc: Mapping[str, Any], token: Any = None) -> ChangeEvent:
    state = doc["state"]
    lease_expiry: datetime | None = None  # the earliest lease of a running entry
    for entry in state["worker_states"]:
        if entry["status"] == "running":
            expire = entry["ping_expire_time"]
            if lease_expiry is None or expire < lease_expiry:
                lease_expiry = expire
    stop = state.get("stop")
    return ChangeEvent(
        key=doc["key"],
        name=doc["name"],
        claim_at=state.get("claim_at"),
        lease_expiry=lease_expiry,
        specific_worker_ids=tuple(doc["option"]["specific_worker_ids"]),
        token=token,
        claimers=tuple(state.get("claimers", ())),
        stop=stop["action"] if stop else None,
        stop_attempts=tuple(stop["attempts"]) if stop else None,
        # only while it may still expire (an insert's projected document has no status: pending)
        deadline=doc["option"].get("deadline") if state.get("status", "pending") == "pending" else None,
        priority=state.get("claim_priority"),
    )
