"""Domain operations for operators: the one API that Python code, the CLI, the REST API and the
dashboard call to look at and steer the scheduler. No rule and no query is written twice: each
operation validates its input, takes the time from the server-corrected clock, and calls one
named driver operation.

Workers (list, remote stop), tasks (get, list, count; cancel, pause, resume, remove, restart) and
plans. ``OperatorApi`` is the contract: ``Operations`` and ``RemoteOperations`` (the same
methods over the REST API) both satisfy it. Each task control is one compare-and-set in the
store on the task's status: it is applied whole or refused (``TransitionRefused``, nothing
changed).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError
from typing_extensions import Unpack

from mscheduler.domain.clock import Clock, ServerClock, truncate_ms
from mscheduler.domain.exceptions import (
    InvalidInput,
    MSchedulerError,
    StorageError,
    TransitionRefused,
    UnknownLimit,
    UnknownPlan,
    UnknownTask,
    error_reason,
)
from mscheduler.domain.fairness import KeyWait, checked_key_waits_input
from mscheduler.domain.family import MAP, dependents, final_steps, map_items, step_graph
from mscheduler.domain.limits import Limit, LimitInfo, Rate, checked_limit, from_storage
from mscheduler.domain.listing import (
    LIST_LIMIT_MAX,
    TaskFilters,
    TaskPage,
    list_params,
    task_page,
)
from mscheduler.domain.model import (
    OptionChange,
    StepInfo,
    Task,
    TaskInfo,
    TaskOption,
    TaskStatus,
    WorkflowInfo,
    checked_params_size,
    item_key,
    validate_key,
    validate_name,
    validate_worker_id,
)
from mscheduler.domain.params_schema import schema_problems
from mscheduler.domain.plans import (
    Plan,
    PlanInfo,
    PlanState,
    checked_plan_id,
    occurrence_key,
    option_to_storage,
    plan_state,
    refire_time,
    run_status_of,
)
from mscheduler.domain.schedule import to_storage_dict
from mscheduler.domain.state import live_attempts
from mscheduler.domain.stats import DEFAULT_WINDOW as DEFAULT_STATS_WINDOW
from mscheduler.domain.stats import StatsStep, TaskStats
from mscheduler.domain.stats import checked_input as checked_stats_input
from mscheduler.drivers.base import (
    WORKERS_PAGE_MAX,
    ControlParams,
    Driver,
    InsertParams,
    InsertPlanParams,
    KeyWaitParams,
    LimitNameTaken,
    MarkParams,
    NewTask,
    PlanListParams,
    PutLimitParams,
    ResetStepsParams,
    StatsParams,
    UniqueParamsTaken,
    UpdateOptionParams,
    UpdatePlanParams,
    WorkerListParams,
)
from mscheduler.publishing import (
    DEFAULT_MAX_PARAMS_BYTES,
    checked_by,
    checked_max_params_bytes,
    insert_families,
    prepared_families,
    run_documents,
    sync_families,
)

log = logging.getLogger("mscheduler.operations")

MANY_MAX = 1000  # keys of one get_tasks / restart_many call
COUNT_CAP = 100_000  # tasks count_tasks counts by default before it answers "at least"
COUNT_MAX = 10_000_000
MANY_AT_ONCE = 16  # restarts of restart_many in flight at once
PLAN_CHANGE_TRIES = 10  # compare-and-set tries of a plan change racing planners
CONTROL_TRIES = 10  # a task control refused, but the task's status allows it on re-read: again
REASON_MAX = 2000
_PENDING, _RUNNING = TaskStatus.PENDING.value, TaskStatus.RUNNING.value
_SUCCEEDED, _FAILED = TaskStatus.SUCCEEDED.value, TaskStatus.FAILED.value
_EXPIRED, _CANCELLED = TaskStatus.EXPIRED.value, TaskStatus.CANCELLED.value
_UNFINISHED = (_PENDING, _RUNNING)
_NOT_RUNNING = tuple(s.value for s in TaskStatus if s is not TaskStatus.RUNNING)
# Statuses an operator may set by hand (set_status): from which statuses, and the rule.
MARKABLE = {
    _SUCCEEDED: (
        (_PENDING, _FAILED, _CANCELLED, _EXPIRED),
        "only a task that is not running and has not succeeded can be set succeeded",
    ),
    _FAILED: ((_PENDING,), "only a pending task (nothing running) can be set failed"),
}
# A control of a parent applied to its children: the children's statuses it applies to.
FAMILY_ACTIONS = {
    "cancel": _UNFINISHED,
    "pause": _UNFINISHED,
    "resume": _UNFINISHED,
    "restart": (_FAILED, _CANCELLED, _EXPIRED),
}
# A worker whose last heartbeat is older than this is reported as not live.
WORKER_LIVENESS = timedelta(seconds=30)
# How long ``send`` trusts its last read of the live handlers (a name it does not know, or params
# its schemas refuse, are always checked against a fresh read before the send is refused).
HANDLERS_FRESH = 1.0
KNOWN_NAMES_SHOWN = 20


@dataclass(slots=True, frozen=True)
class HandlerInfo:
    """A task name that live workers handle: how many, and the JSON schema of its params as the
    most recently started of them publishes it (None: that worker publishes none — a handler
    without a pydantic params model, or a remote executor). ``schemas``: every distinct schema
    the live workers publish, newest first (None among them: some worker checks nothing)."""

    name: str
    workers: int
    params_schema: dict[str, Any] | None
    schemas: tuple[dict[str, Any] | None, ...] = ()


@dataclass(slots=True, frozen=True)
class RestartOutcome:
    """What ``Operations.restart_many`` did to one key: ``outcome`` is ``restarted`` (``task``:
    the task after it), ``refused`` (``status`` and ``rule`` say why; nothing changed) or
    ``unknown`` (no such task)."""

    key: str
    outcome: str
    task: TaskInfo | None = None
    status: str | None = None
    rule: str | None = None

    @property
    def restarted(self) -> bool:
        return self.outcome == "restarted"


BULK_ACTIONS = ("cancel", "pause", "resume", "restart", "remove")
BULK_PAGE = 200  # tasks a bulk action over a filter reads and changes per page


@dataclass(slots=True, frozen=True)
class BulkOutcome:
    """What a bulk action (``control_many``, ``control_matching``) did to one task: ``done``,
    ``refused`` (``status`` and ``rule`` say why; nothing changed) or ``unknown`` (gone)."""

    key: str
    outcome: str
    status: str | None = None
    rule: str | None = None


@dataclass(slots=True, frozen=True)
class TaskCount:
    """How many tasks a filter selects: ``count``, or at least that many when ``capped``."""

    count: int
    capped: bool


@dataclass(slots=True, frozen=True)
class WorkerView:
    """A registered consumer as an operator sees it."""

    worker_id: str
    host: str
    pid: int
    names: tuple[str, ...]
    concurrency: int
    start_time: datetime
    last_seen: datetime
    running_cnt: int
    stop_requested: bool
    stop_time: datetime | None
    live: bool  # running, with a recent heartbeat
    groups: tuple[str, ...] = ()  # the worker groups it serves (none: only tasks without groups)

    @property
    def cursor(self) -> str:
        """Where a listing goes on after this worker (``list_workers(after=...)``)."""
        raw = json.dumps({"t": self.start_time.isoformat(), "w": self.worker_id})
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def worker_cursor_position(cursor: str) -> tuple[datetime, str]:
    """A ``WorkerView.cursor`` as the (start_time, worker_id) it stands for; ``InvalidInput`` if
    it is not one."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        when = datetime.fromisoformat(raw["t"])
        worker_id = raw["w"]
        if when.tzinfo is None or not isinstance(worker_id, str):
            raise ValueError("not a worker cursor")
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise InvalidInput("after: not a cursor of a worker listing") from exc
    return when, worker_id


class OperatorApi(Protocol):
    """The operator contract: what the CLI calls, on the store (``Operations``) or over the REST
    API (``RemoteOperations``), both with these signatures (mypy checks it where the CLI takes
    one; ``tests/unit/test_operator_api.py`` compares every public method's). The methods'
    documentation is ``Operations``'."""

    # -- workers
    async def list_workers(
        self, *, limit: int = WORKERS_PAGE_MAX, after: str | None = None, live: bool = False
    ) -> list[WorkerView]: ...
    async def request_worker_stop(self, worker_id: str) -> bool: ...

    # -- flow limits
    async def set_limit(
        self,
        key: str,
        *,
        names: Sequence[str] | None = None,
        max_running: int | None = None,
        rate: Rate | str | None = None,
    ) -> LimitInfo: ...
    async def get_limit(self, key: str) -> LimitInfo: ...
    async def list_limits(self) -> list[LimitInfo]: ...
    async def remove_limit(self, key: str) -> None: ...

    # -- tasks
    async def get_task(self, key: str) -> TaskInfo: ...
    async def get_tasks(self, keys: Sequence[str]) -> dict[str, TaskInfo]: ...
    async def page_tasks(self, **filters: Unpack[TaskFilters]) -> TaskPage: ...
    async def count_tasks(self, *, cap: int = COUNT_CAP, **filters: Unpack[TaskFilters]) -> TaskCount: ...
    async def list_tasks(self, **filters: Unpack[TaskFilters]) -> list[TaskInfo]: ...
    async def count_by_status(self) -> dict[str, int]: ...
    async def stats(
        self,
        *,
        window: timedelta | float | None = DEFAULT_STATS_WINDOW,
        names: Sequence[str] | None = None,
        statuses: Sequence[str] | None = None,
        on_step: StatsStep | None = None,
    ) -> TaskStats: ...
    async def key_waits(self, *, names: Sequence[str] | None = None, limit: int = 100) -> list[KeyWait]: ...

    # -- publishing
    async def list_handlers(self) -> list[HandlerInfo]: ...
    async def send(
        self, task: Task, *, reset_finished: bool = False, allow_unknown: bool = False, by: str | None = None
    ) -> bool: ...
    async def send_many(
        self,
        tasks: Sequence[Task],
        *,
        reset_finished: bool = False,
        allow_unknown: bool = False,
        by: str | None = None,
    ) -> list[bool]: ...

    # -- task control
    async def cancel(self, key: str, reason: str = "", *, by: str | None = None) -> TaskInfo: ...
    async def pause(self, key: str, *, stop_running: bool = False, by: str | None = None) -> TaskInfo: ...
    async def resume(self, key: str, *, by: str | None = None) -> TaskInfo: ...
    async def remove(self, key: str, *, force: bool = False, by: str | None = None) -> None: ...
    async def restart(
        self, key: str, *, force: bool = False, by: str | None = None, deadline: datetime | None = None
    ) -> TaskInfo: ...
    async def restart_many(
        self, keys: Sequence[str], *, force: bool = False, deadline: datetime | None = None
    ) -> dict[str, RestartOutcome]: ...
    async def control_many(
        self,
        action: str,
        keys: Sequence[str],
        *,
        reason: str = "",
        force: bool = False,
        stop_running: bool = False,
        by: str | None = None,
    ) -> list[BulkOutcome]: ...
    async def control_matching(
        self,
        action: str,
        *,
        reason: str = "",
        force: bool = False,
        stop_running: bool = False,
        by: str | None = None,
        page_size: int = BULK_PAGE,
        **filters: Unpack[TaskFilters],
    ) -> AsyncIterator[list[BulkOutcome]]: ...
    async def edit(self, key: str, change: OptionChange, *, by: str | None = None) -> TaskOption: ...

    # -- child tasks and workflows
    async def set_status(
        self, key: str, status: str, *, reason: str = "", by: str = "operator"
    ) -> TaskInfo: ...
    async def set_child_status(
        self, key: str, child: str, status: str, *, reason: str = "", by: str = "operator"
    ) -> TaskInfo: ...
    async def restart_child(self, key: str, child: str, *, force: bool = False) -> TaskInfo: ...
    async def workflow(self, key: str) -> WorkflowInfo: ...
    async def restart_step(self, key: str, step: str, *, by: str | None = None) -> WorkflowInfo: ...

    # -- plans
    async def add_plan(self, plan: Plan) -> PlanInfo: ...
    async def get_plan(self, plan_id: str) -> PlanInfo: ...
    async def list_plans(
        self, *, state: str | None = None, limit: int = 100, skip: int = 0
    ) -> list[PlanInfo]: ...
    async def run_plan_now(self, plan_id: str) -> TaskInfo: ...
    async def suspend_plan(self, plan_id: str) -> PlanInfo: ...
    async def resume_plan(self, plan_id: str) -> PlanInfo: ...
    async def skip_plan(self, plan_id: str, n: int = 1) -> PlanInfo: ...
    async def edit_plan(self, plan_id: str, **changes: Any) -> PlanInfo: ...
    async def remove_plan(self, plan_id: str) -> None: ...


class Operations:
    """Operator operations over one store.

    :param driver: the storage.
    :param clock: time source; by default the system clock corrected to the server's clock (the
        same correction consumers use, so a stop request is stamped in the server's time).
    :param max_params_bytes: the largest params ``send`` / ``send_many`` accept (their BSON size),
        as ``Publisher(max_params_bytes=...)``, and a plan's (``add_plan``, ``edit_plan``): every
        run of a plan carries them.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        max_params_bytes: int = DEFAULT_MAX_PARAMS_BYTES,
    ) -> None:
        self.driver = driver
        self.clock = clock if isinstance(clock, ServerClock) else ServerClock(clock)
        self.max_params_bytes = checked_max_params_bytes(max_params_bytes)
        self._synced = False
        self._plans_set_up = False
        self._tasks_checked = False
        self._handlers_read: tuple[float, dict[str, HandlerInfo]] | None = None

    async def _now(self) -> datetime:
        if not self._synced:
            await self.clock.sync(self.driver.server_time)
            self._synced = True
        return self.clock.now()

    # -- workers ------------------------------------------------------------------------------

    async def list_workers(
        self, *, limit: int = WORKERS_PAGE_MAX, after: str | None = None, live: bool = False
    ) -> list[WorkerView]:
        """Registered consumers and executors, oldest first, with whether each is live: a page of
        at most ``limit``, after the cursor ``after`` (``WorkerView.cursor`` of the last one of
        the previous page). Registrations not seen for the store's worker retention (1 day) are
        gone. ``live``: only the live ones (not stopped, seen within 30 s; any order)."""
        if not isinstance(limit, int) or not 1 <= limit <= WORKERS_PAGE_MAX:
            raise InvalidInput(f"limit: must be an integer from 1 to {WORKERS_PAGE_MAX}")
        now = await self._now()
        params = WorkerListParams(
            now,
            live_since=now - WORKER_LIVENESS if live else None,
            after=worker_cursor_position(after) if after is not None else None,
            limit=limit,
        )
        views = []
        for w in await self.driver.list_workers(params):
            stop_time = w.get("stop_time")
            views.append(
                WorkerView(
                    worker_id=w["worker_id"],
                    host=w["host"],
                    pid=w["pid"],
                    names=tuple(w["names"]),
                    concurrency=w["concurrency"],
                    start_time=w["start_time"],
                    last_seen=w["last_seen"],
                    running_cnt=w["running_cnt"],
                    stop_requested=bool(w.get("stop_requested")),
                    stop_time=stop_time,
                    live=stop_time is None and w["last_seen"] >= now - WORKER_LIVENESS,
                    groups=tuple(w.get("groups") or ()),  # workers registered before groups: none
                )
            )
        return views if live else sorted(views, key=lambda v: (v.start_time, v.worker_id))

    async def request_worker_stop(self, worker_id: str) -> bool:
        """Ask a running consumer to stop gracefully (it sees the request at its next heartbeat).
        False if no running consumer has that id (unknown, or stopped already)."""
        return await self.driver.request_worker_stop(checked_worker_id(worker_id), await self._now())

    # -- flow limits ----------------------------------------------------------------

    async def set_limit(
        self,
        key: str,
        *,
        names: Sequence[str] | None = None,
        max_running: int | None = None,
        rate: Rate | str | None = None,
    ) -> LimitInfo:
        """Create or replace the flow limit ``key``: at most ``max_running`` attempts of its
        ``names`` (default ``[key]``) running at once across the cluster and / or at most ``rate``
        starts per period (``"10/s"``, ``"1000/h"``). Applies to every consumer's next claim
        (slots held already are kept: a lowered ``max_running`` grants nothing until the running
        count is below it). A name covered by another limit is ``InvalidInput``."""
        limit = limit_input(key, names, max_running, rate)
        now = await self._now()
        try:
            await self.driver.put_limit(PutLimitParams(limit.key, limit.to_storage(), now))
        except LimitNameTaken as exc:
            raise InvalidInput(str(exc)) from exc
        return await self.get_limit(limit.key)

    async def get_limit(self, key: str) -> LimitInfo:
        """The limit with its live state (running slots, starts in the window); ``UnknownLimit``."""
        doc = await self.driver.get_limit(_checked(_limit_key, key, "key"))
        if doc is None:
            raise UnknownLimit(key)
        return from_storage(doc, await self._now())

    async def list_limits(self) -> list[LimitInfo]:
        now = await self._now()
        return [from_storage(doc, now) for doc in await self.driver.list_limits()]

    async def remove_limit(self, key: str) -> None:
        """Remove a limit: its names are unlimited from every consumer's next limit refresh."""
        if not await self.driver.delete_limit(_checked(_limit_key, key, "key")):
            raise UnknownLimit(key)

    # -- tasks --------------------------------------------------------------------------------

    async def get_task(self, key: str) -> TaskInfo:
        """The task as stored; raises ``UnknownTask``."""
        doc = await self.driver.get_task(_checked(validate_key, key, "key"))
        if doc is None:
            raise UnknownTask(key)
        return TaskInfo.from_storage(doc)

    async def get_tasks(self, keys: Sequence[str]) -> dict[str, TaskInfo]:
        """Many tasks in one read, keyed by key in the order given; unknown keys are
        left out. At most ``MANY_MAX`` distinct keys; a bad key is ``InvalidInput``."""
        checked = checked_keys(keys)
        docs = {doc["key"]: doc for doc in await self.driver.get_tasks(checked)} if checked else {}
        return {key: TaskInfo.from_storage(docs[key]) for key in checked if key in docs}

    async def page_tasks(self, **filters: Unpack[TaskFilters]) -> TaskPage:
        """One page of tasks oldest first (with ``key_prefix``: in key order; with a finished range
        and no prefix: by finish time), filtered by ``status``, ``name``, ``key_prefix``,
        ``worker_id`` (an entry of that worker), ``group`` (tasks aimed at that worker group),
        creation time ``created_from`` / ``created_to`` and finish time ``finished_from`` /
        ``finished_to`` (``[from, to)``; finished tasks only: a restart takes a task out); each
        combination is one bounded index range (docs/design.md). ``limit`` (default 100) tasks a
        page; pass ``next_cursor`` back as ``cursor`` with the same filters for the next page.
        Every value is checked
        (``InvalidInput``, nothing queried)."""
        params = list_params(**filters)
        return task_page(params, await self.driver.list_tasks(params))

    async def count_tasks(self, *, cap: int = COUNT_CAP, **filters: Unpack[TaskFilters]) -> TaskCount:
        """How many tasks the filters of ``page_tasks`` select, counting at most ``cap`` (1 to
        ``COUNT_MAX``): a store of millions answers "at least ``cap``" (``capped``) in the time
        ``cap`` index keys take. The count a bulk action's confirmation shows."""
        if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= COUNT_MAX:
            raise InvalidInput(f"cap: an integer from 1 to {COUNT_MAX}")
        params = list_params(**{k: v for k, v in filters.items() if k not in ("cursor", "limit")})
        counted = await self.driver.count_tasks(params, cap)
        return TaskCount(counted, counted >= cap)

    async def list_tasks(self, **filters: Unpack[TaskFilters]) -> list[TaskInfo]:
        """The tasks of ``page_tasks`` (without the next cursor)."""
        return (await self.page_tasks(**filters)).tasks

    async def count_by_status(self) -> dict[str, int]:
        """How many tasks are in each status (statuses with none are 0)."""
        counts = await self.driver.count_by_status()
        return {s.value: counts.get(s.value, 0) for s in TaskStatus}

    async def stats(
        self,
        *,
        window: timedelta | float | None = DEFAULT_STATS_WINDOW,
        names: Sequence[str] | None = None,
        statuses: Sequence[str] | None = None,
        on_step: StatsStep | None = None,
    ) -> TaskStats:
        """Statistics (definitions in ``mscheduler.domain.stats``): counts by status and name,
        the oldest due pending task's age, and over the ``window`` (a timedelta or seconds, 1
        minute to 7 days) first- and second-attempt success rates, duration p50 / p95 per name,
        and the last hour's throughput per minute. ``window=None``: counts and ages only (one
        aggregation, what the metrics' gauges read). ``names`` / ``statuses``: only these.
        ``on_step(what)``: called before each read of the store (the progress a caller can show
        of a long computation over a large store)."""
        checked_window, checked_names, checked_statuses = checked_stats_input(window, names, statuses)
        params = StatsParams(await self._now(), checked_window, checked_names, checked_statuses)
        return await self.driver.task_stats(params, on_step)

    async def key_waits(self, *, names: Sequence[str] | None = None, limit: int = 100) -> list[KeyWait]:
        """The fairness keys with due tasks (of ``names``; None: every name), the longest wait
        first, at most ``limit`` (1 to 1,000): per key, how many tasks are due (claimable now)
        and how long the one due first has waited, in seconds."""
        checked_names, checked_limit = checked_key_waits_input(names, limit)
        return await self.driver.key_waits(KeyWaitParams(await self._now(), checked_names, checked_limit))

    # -- publishing -----------------------------------------------------------------------------

    async def list_handlers(self) -> list[HandlerInfo]:
        """The task names live workers handle (consumers and executors registered and heard from
        within 30 s), by name, with their params' JSON schemas: what ``send`` checks against."""
        now = await self._now()
        params = WorkerListParams(now, live_since=now - WORKER_LIVENESS, schemas=True)
        live = [
            w
            for w in await self.driver.list_workers(params)
            if w.get("stop_time") is None and w["last_seen"] >= now - WORKER_LIVENESS
        ]
        live.sort(key=lambda w: (w["start_time"], w["worker_id"]), reverse=True)  # newest first
        found: dict[str, list[dict[str, Any] | None]] = {}
        for worker in live:
            published = {s["name"]: s["schema"] for s in worker.get("schemas") or ()}
            for name in worker["names"]:
                found.setdefault(name, []).append(_schema_of(published.get(name)))
        return [
            HandlerInfo(name, len(schemas), schemas[0], tuple(_distinct(schemas)))
            for name, schemas in sorted(found.items())
        ]

    async def send(
        self, task: Task, *, reset_finished: bool = False, allow_unknown: bool = False, by: str | None = None
    ) -> bool:
        """Publish ``task`` unless its key exists; True if this call created (or reset)
        it. The rules are ``Publisher.send``'s, from the same code (``mscheduler.publishing``),
        and the task is checked at the door (``send_many``): the REST API's ``POST
        /api/v1/tasks`` and ``mscheduler tasks send`` are this call (``by``: who sends, the
        token's ``api:<name>``)."""
        if not isinstance(task, Task):
            raise InvalidInput(f"send() takes a Task, got {type(task).__name__}")
        return (
            await self.send_many([task], reset_finished=reset_finished, allow_unknown=allow_unknown, by=by)
        )[0]

    async def send_many(
        self,
        tasks: Sequence[Task],
        *,
        reset_finished: bool = False,
        allow_unknown: bool = False,
        by: str | None = None,
    ) -> list[bool]:
        """Publish many tasks (``Publisher.send_many``'s rules): every task is checked before
        anything is written; a bool per task, in order, True where it was created (or reset).

        Checked at the door, unlike a ``Publisher`` (which warns): a task whose name no live
        worker handles is refused, naming the names that are handled (``allow_unknown=True``: a
        worker that is not running yet will take it), and params are validated against the
        JSON schema the live workers publish for the name (``InvalidInput`` with ``field``, the
        path of the first field at fault). ``by``: who sends (the ``sent`` events and a reset's
        history record it)."""
        if isinstance(tasks, (str, bytes, Task)) or not isinstance(tasks, Sequence):
            raise InvalidInput(f"tasks: a list of Tasks, got {type(tasks).__name__}")
        for flag, value in (("reset_finished", reset_finished), ("allow_unknown", allow_unknown)):
            if not isinstance(value, bool):
                raise InvalidInput(f"{flag}: must be True or False")
        by = checked_by(by)
        now = await self._now()
        families = prepared_families(
            tasks, now=now, reset_finished=reset_finished, max_params_bytes=self.max_params_bytes
        )
        if not self._tasks_checked:  # the unique key index before the first insert
            await self.driver.prepare()  # checked, never built here: `mscheduler setup` builds
            self._tasks_checked = True
        await self._check_at_the_door(families, allow_unknown, single=len(tasks) == 1)
        return await insert_families(
            self.driver, families, self.clock.now, reset_finished=reset_finished, by=by
        )

    async def _handlers(self, fresh: bool) -> dict[str, HandlerInfo]:
        """The live handlers by name, read again when ``fresh`` or older than ``HANDLERS_FRESH``."""
        held = self._handlers_read
        if fresh or held is None or self.clock.monotonic() - held[0] > HANDLERS_FRESH:
            handlers = {h.name: h for h in await self.list_handlers()}
            held = self._handlers_read = (self.clock.monotonic(), handlers)
        return held[1]

    async def _check_at_the_door(
        self, families: list[list[NewTask]], allow_unknown: bool, single: bool
    ) -> None:
        """Refuse a task no live worker handles (unless ``allow_unknown``) or whose params the
        handler's published schema refuses. A refusal is confirmed on a fresh read first."""
        docs = [doc for family in families for doc in family if doc.children is None]
        fresh = False
        while True:
            handlers = await self._handlers(fresh)
            try:
                for doc in docs:
                    check_handled(doc, handlers.get(doc.name), handlers, allow_unknown, single)
                return
            except InvalidInput:
                if fresh:
                    raise
                fresh = True

    # -- task control -------------------------------------------------------------------------

    async def cancel(self, key: str, reason: str = "", *, by: str | None = None) -> TaskInfo:
        """End a pending or running task as ``cancelled`` (terminal). A running handler is
        cancelled as soon as its consumer hears of it (the change stream; without one, its next
        ping) and its outcome is refused; ``wait`` raises ``TaskCancelled``. Refused on a
        finished task (succeeded, failed, expired, cancelled). ``by``: who did it (kept in
        ``state.cancelled`` and the event; every control takes it)."""
        checked_reason(reason)
        rule = "only a pending or running task can be cancelled"
        return await self._change(key, "cancel", _UNFINISHED, rule, reason=reason, by=checked_by(by))

    async def pause(self, key: str, *, stop_running: bool = False, by: str | None = None) -> TaskInfo:
        """Stop claims of a pending or running task until ``resume``; refused on a finished task.

        By default a running attempt runs on and the status stays. With ``stop_running=True`` the
        same write also tells the running attempts to stop: their handlers are cancelled as soon
        as their consumers hear of it (change stream, else the next ping), their leases are no
        longer renewed and their outcomes are refused; each attempt keeps its entry (and its
        slot: never twice at once) until its consumer settles it ``released`` (error type
        ``Paused``; not counted against the retry budget) once the handler stopped, or the lease
        pass does at its lease's end. ``resume`` lets the task run again, from its last
        checkpoint, with its budget intact."""
        if not isinstance(stop_running, bool):
            raise InvalidInput("stop_running: must be True or False")
        rule = "a finished task cannot be paused"
        return await self._change(
            key, "pause", _UNFINISHED, rule, stop_running=stop_running, by=checked_by(by)
        )

    async def resume(self, key: str, *, by: str | None = None) -> TaskInfo:
        """Make a paused task claimable again. Refused on a finished task."""
        rule = "a finished task cannot be resumed"
        return await self._change(key, "resume", _UNFINISHED, rule, by=checked_by(by))

    async def remove(self, key: str, *, force: bool = False, by: str | None = None) -> None:
        """Delete a task that is not running; a running one only with ``force=True`` (it is
        cancelled first, so its handler is stopped as by ``cancel``). A task with children is removed
        with its children (children first, each under the same rule); a child only with its
        parent."""
        by = checked_by(by)
        doc = await self.driver.get_task(_checked(validate_key, key, "key"))
        if doc is not None and doc.get("parent") is not None:
            rule = f"a child task is removed with its parent ({doc['parent']!r})"
            raise TransitionRefused(key, "remove", doc["state"]["status"], rule)
        for child in (doc or {}).get("children", {}).get("keys", []):
            await self._remove_child(child, force, by)
        if force:
            try:
                await self._control(key, "cancel", (_RUNNING,), "", reason="removed", by=by)
            except TransitionRefused:
                pass  # not running (any more): removed below as it is
        rule = "a running task is removed only with force=True (it is cancelled first)"
        await self._control(key, "remove", _NOT_RUNNING, rule, by=by)

    async def restart(
        self, key: str, *, force: bool = False, by: str | None = None, deadline: datetime | None = None
    ) -> TaskInfo:
        """Run a failed, cancelled or expired task again (a succeeded one only with
        ``force=True``; a pending or running one never): its attempts are kept in
        ``state.history`` as an earlier generation and the retry budget starts afresh. Its
        deadline: ``deadline`` when given (a time to come, not before the task's ``run_at``),
        else the old one, dropped if already past (an expired task restarts without one: it
        would expire again at once). Refused (``TransitionRefused`` naming it) while an attempt
        still holds a live lease — a cancelled task's handler is stopped and its attempt settled
        within a ping interval of the cancel — so the task never runs twice at once across
        generations."""
        statuses = (_FAILED, _CANCELLED, _EXPIRED, *((_SUCCEEDED,) if force else ()))
        rule = "only a failed, cancelled or expired task can be restarted" + (
            "" if force else " (a succeeded one with force=True)"
        )
        if deadline is not None:
            deadline = await self._new_deadline(key, deadline)
        if force and (info := await self.get_task(key)).children is not None:
            rule = "a task with children is not restarted with force: restart_child(..., force=True)"
            raise TransitionRefused(key, "restart", info.status.value, rule)
        try:
            return await self._change(key, "restart", statuses, rule, by=checked_by(by), deadline=deadline)
        except UniqueParamsTaken as exc:  # unique_by="params": one live task per params hash
            held = f"live task {exc.holder!r}" if exc.holder else "a live task"
            status = (await self.get_task(key)).status.value
            raise TransitionRefused(key, "restart", status, f"{held} has the same params") from None

    async def _new_deadline(self, key: str, deadline: object) -> datetime:
        """A restart's new deadline, checked: an aware time to come, not before ``run_at``."""
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            raise InvalidInput("deadline: a timezone-aware datetime (e.g. datetime.now(UTC) + ...)")
        deadline = truncate_ms(deadline.astimezone(UTC))
        if deadline <= await self._now():
            raise InvalidInput(f"deadline: {deadline.isoformat()} has passed (a restart needs one to come)")
        run_at = (await self.get_task(key)).option.run_at
        if run_at is not None and run_at > deadline:
            raise InvalidInput(
                f"deadline: {deadline.isoformat()} is before the task's run_at ({run_at.isoformat()}): "
                "it could never start"
            )
        return deadline

    async def restart_many(
        self, keys: Sequence[str], *, force: bool = False, deadline: datetime | None = None
    ) -> dict[str, RestartOutcome]:
        """``restart`` of each key (re-run many lost or failed tasks), each its own
        compare-and-set under the same rules, a few at a time; the outcome per key, in the order
        given: restarted, refused (with the status and the rule) or unknown. Keys are validated
        first: bad input (``InvalidInput``) restarts nothing. ``Publisher.send_many(...,
        reset_finished=True)`` is the other way to run tasks again: it re-creates missing keys and
        resets succeeded / failed ones with new params (their attempts kept in the history)."""
        return await restart_each(
            checked_keys(keys), lambda key: self.restart(key, force=force, deadline=deadline)
        )

    async def control_many(
        self,
        action: str,
        keys: Sequence[str],
        *,
        reason: str = "",
        force: bool = False,
        stop_running: bool = False,
        by: str | None = None,
    ) -> list[BulkOutcome]:
        """``action`` (cancel, pause, resume, restart, remove) on each key, each its own
        compare-and-set under the action's rules, a few at a time; the outcome per key in the
        order given. Keys and options are checked first: bad input changes nothing."""
        run = self._bulk_action(action, reason=reason, force=force, stop_running=stop_running, by=by)
        return await self._bulk(run, checked_keys(keys))

    async def control_matching(
        self,
        action: str,
        *,
        reason: str = "",
        force: bool = False,
        stop_running: bool = False,
        by: str | None = None,
        page_size: int = BULK_PAGE,
        **filters: Unpack[TaskFilters],
    ) -> AsyncIterator[list[BulkOutcome]]:
        """``action`` on every task the filters of ``page_tasks`` select, page by page (a
        listing in the filters' own order, by cursor), yielding each page's outcomes: the caller
        shows progress and may stop between pages. Tasks created after the call are left out
        (the creation range ends now), so the action ends even while tasks keep arriving. Bad
        input is refused before anything changes; ``sort``, ``cursor`` and ``limit`` are not
        filters here."""
        run = self._bulk_action(action, reason=reason, force=force, stop_running=stop_running, by=by)
        if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= MANY_MAX:
            raise InvalidInput(f"page_size: an integer from 1 to {MANY_MAX}")
        selected: dict[str, Any] = {k: v for k, v in filters.items() if k not in ("sort", "cursor", "limit")}
        now = await self._now() + timedelta(milliseconds=1)
        created_to = selected.get("created_to")
        if created_to is None or (
            isinstance(created_to, datetime) and created_to.tzinfo is not None and created_to > now
        ):
            selected["created_to"] = now
        list_params(**selected)  # every filter checked before the first change
        return self._bulk_pages(run, selected, page_size)

    async def _bulk_pages(
        self, run: Callable[[str], Awaitable[BulkOutcome]], selected: dict[str, Any], page_size: int
    ) -> AsyncIterator[list[BulkOutcome]]:
        cursor = None
        while True:
            page = await self.page_tasks(**selected, cursor=cursor, limit=page_size)
            if page.tasks:
                yield await self._bulk(run, [t.key for t in page.tasks])
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def _bulk_action(
        self, action: str, *, reason: str, force: bool, stop_running: bool, by: str | None
    ) -> Callable[[str], Awaitable[BulkOutcome]]:
        """The checked action as a function of a key (its outcome, never a refusal raised)."""
        if action not in BULK_ACTIONS:
            raise InvalidInput(f"action: one of {', '.join(BULK_ACTIONS)}, got {action!r}")
        for name, value in (("force", force), ("stop_running", stop_running)):
            if not isinstance(value, bool):
                raise InvalidInput(f"{name}: must be True or False")
        checked_reason(reason)
        by = checked_by(by)
        calls: dict[str, Callable[[str], Awaitable[Any]]] = {
            "cancel": lambda key: self.cancel(key, reason, by=by),
            "pause": lambda key: self.pause(key, stop_running=stop_running, by=by),
            "resume": lambda key: self.resume(key, by=by),
            "restart": lambda key: self.restart(key, force=force, by=by),
            "remove": lambda key: self.remove(key, force=force, by=by),
        }
        call = calls[action]

        async def run(key: str) -> BulkOutcome:
            try:
                await call(key)
            except TransitionRefused as exc:
                return BulkOutcome(key, "refused", status=exc.status, rule=exc.rule)
            except UnknownTask:
                return BulkOutcome(key, "unknown")
            return BulkOutcome(key, "done")

        return run

    async def _bulk(self, run: Callable[[str], Awaitable[BulkOutcome]], keys: list[str]) -> list[BulkOutcome]:
        outcomes: dict[str, BulkOutcome] = {}

        async def one(key: str) -> None:
            outcomes[key] = await run(key)

        for start in range(0, len(keys), MANY_AT_ONCE):
            await asyncio.gather(*(one(key) for key in keys[start : start + MANY_AT_ONCE]))
        return [outcomes[key] for key in keys]

    async def edit(self, key: str, change: OptionChange, *, by: str | None = None) -> TaskOption:
        """Change a pending or running task's options (due time, priority, retry budget or
        policy, targeting, ...) under the live-option rules of ``change_option``. Refused on a
        finished task (restart it instead)."""
        info = await self.get_task(key)
        if info.status.value not in _UNFINISHED:
            rule = "only a pending or running task can be edited (restart a finished one)"
            raise TransitionRefused(key, "edit", info.status.value, rule)
        return await change_option(self.driver, key, change, await self._now(), by=checked_by(by))

    # -- child tasks (mscheduler.services.children) ------------------------------------------------------

    async def set_status(self, key: str, status: str, *, reason: str = "", by: str = "operator") -> TaskInfo:
        """Set a task's status by hand: ``succeeded`` (a step done by hand: the task
        is pending, failed, cancelled or expired, nothing running) or ``failed`` (a pending task,
        nothing running). Recorded as ``state.marked`` {status, reason, by, time}; the task is
        not claimed again until a restart (which clears it). A child's parent is synced. A task
        with children takes its status from them: refused (set its children's)."""
        checked_mark(status, reason, by)
        key = _checked(validate_key, key, "key")
        statuses, rule = MARKABLE[status]
        for _ in range(CONTROL_TRIES):
            params = MarkParams(key, status, statuses, await self._now(), reason, by)
            if await self.driver.mark_task(params):
                return await self._follow_family(await self.get_task(key), "mark")
            info = await self.get_task(key)
            if info.children is not None:
                rule = "a task with children takes its status from them (set a child's status)"
                raise TransitionRefused(key, f"set status {status}", info.status.value, rule)
            if info.status.value not in statuses or info.running_cnt:
                raise TransitionRefused(key, f"set status {status}", info.status.value, rule)
        raise StorageError(f"task {key!r} kept changing under {CONTROL_TRIES} tries; try again")

    async def set_child_status(
        self, key: str, child: str, status: str, *, reason: str = "", by: str = "operator"
    ) -> TaskInfo:
        """Set the status of the child ``child`` of task ``key``: ``succeeded`` or
        ``failed`` by hand (``set_status``), ``cancelled`` (``cancel``) or ``pending``
        (``restart``: a failed, cancelled or expired child runs again). The parent is synced:
        marking a sequential step done starts the next one. Returns the child."""
        if status == _CANCELLED:
            return await self.cancel(await self._child_key(key, child), reason)
        if status == _PENDING:
            return await self.restart(await self._child_key(key, child))
        if status not in MARKABLE:
            choices = ", ".join((*MARKABLE, _CANCELLED, _PENDING))
            raise InvalidInput(f"status: one of {choices}, got {status!r}")
        return await self.set_status(await self._child_key(key, child), status, reason=reason, by=by)

    async def restart_child(self, key: str, child: str, *, force: bool = False) -> TaskInfo:
        """Run the child ``child`` of task ``key`` again under the rules of ``restart`` (a
        failed, cancelled or expired child; a succeeded one with ``force=True``); the parent is
        synced, so a parent failed by that child is pending or running again. Returns the child."""
        return await self.restart(await self._child_key(key, child), force=force)

    async def _child_key(self, key: str, child: str) -> str:
        return child_key_of(await self.get_task(key), child)

    async def _follow_family(
        self,
        info: TaskInfo,
        action: str,
        *,
        reason: str = "",
        stop_running: bool = False,
        by: str | None = None,
    ) -> TaskInfo:
        """After a change of one task: a cancel, pause, resume or restart of a parent (a
        fanned-out map step too) is applied to those of its children it applies to (each its own
        compare-and-set, down to a map step's items), then the parent and the child's parent are
        synced (docs/design.md, "Child tasks")."""
        is_parent = info.children is not None or info.items is not None
        if is_parent and action in FAMILY_ACTIONS:
            await self._apply_to_children(info, action, reason=reason, stop_running=stop_running, by=by)
        keys = [*([info.key] if is_parent else []), *([info.parent] if info.parent is not None else [])]
        if keys:
            await sync_families(self.driver, keys, await self._now())
        return await self.get_task(info.key) if is_parent else info

    async def _apply_to_children(
        self, info: TaskInfo, action: str, *, reason: str, stop_running: bool, by: str | None
    ) -> None:
        keys = [c.key for c in info.children or ()] + [item_key(info.key, i) for i in range(info.items or 0)]
        for key in keys:
            try:
                statuses = FAMILY_ACTIONS[action]
                child = await self._control(
                    key, action, statuses, "", reason=reason, stop_running=stop_running, by=by
                )
            except (TransitionRefused, UnknownTask):
                continue  # not in a status the action applies to (or gone): left as it is
            if child is not None and child.items is not None:  # a map step: its items too
                await self._apply_to_children(child, action, reason=reason, stop_running=stop_running, by=by)

    # -- workflows ------------------------------------------------------------------------------

    async def workflow(self, key: str) -> WorkflowInfo:
        """A task with children as a graph (``WorkflowInfo``): each step's status, what it needs,
        and a fanned-out map step's items by status. ``InvalidInput`` for a task without children."""
        doc = await self.driver.get_task(_checked(validate_key, key, "key"))
        if doc is None:
            raise UnknownTask(key)
        definition = doc.get("children")
        if not definition or definition.get("mode") == MAP:
            raise InvalidInput(f"task {key!r} has no steps (it is not a task with children)")
        graph = step_graph(definition)
        steps = {
            d["key"]: TaskInfo.from_storage(d)
            for d in await self.driver.get_tasks([k for _, k, _, _ in graph])
        }
        out = []
        for name, step_key, needs, over in graph:
            step = steps.get(step_key)
            status = step.status if step is not None else TaskStatus.PENDING
            counts = await self._item_counts(step_key) if step is not None and step.items else None
            blocked = step.blocked if step is not None else True
            items = step.items if step is not None else None
            out.append(
                StepInfo(
                    name=name,
                    key=step_key,
                    status=status,
                    needs=needs,
                    map_over=over,
                    blocked=blocked,
                    items=items,
                    item_statuses=counts,
                )
            )
        info = TaskInfo.from_storage(doc)
        finals = [name for name, _ in final_steps(definition)]
        return WorkflowInfo(
            key=info.key, status=info.status, mode=definition["mode"], steps=out, final=finals
        )

    async def _item_counts(self, step_key: str) -> dict[str, int]:
        """A map step's items by status (one read of index keys)."""
        return dict(sorted((await self.driver.count_items(step_key)).items()))

    async def restart_step(self, key: str, step: str, *, by: str | None = None) -> WorkflowInfo:
        """Run the step ``step`` of workflow ``key`` again, and every step that depends on it
        (its results change): the step (finished: succeeded, failed, cancelled or expired) is
        restarted, and its dependents are restarted and blocked until what they need has
        succeeded again (a fanned-out map step's items are removed: it fans out again). Refused
        (``TransitionRefused``, nothing changed) while the step or a dependent is pending or
        running, or the workflow is cancelled. Returns the workflow."""
        by = checked_by(by)
        parent = await self.get_task(key)
        doc = await self.driver.get_task(parent.key)
        definition = (doc or {}).get("children")
        if not definition or definition.get("mode") == MAP:
            raise InvalidInput(f"task {key!r} has no steps (it is not a task with children)")
        graph = step_graph(definition)
        key_of = {name: k for name, k, _, _ in graph}
        if step not in key_of:
            raise InvalidInput(f"task {key!r} has no step named {step!r} (its steps: {', '.join(key_of)})")
        if parent.cancelled is not None:
            raise TransitionRefused(
                key, "restart a step of", parent.status.value, "restart the cancelled workflow"
            )
        later = dependents(graph, step)
        infos = {
            k: TaskInfo.from_storage(d)
            for k, d in [(d["key"], d) for d in await self.driver.get_tasks(list(key_of.values()))]
        }
        target = infos.get(key_of[step])
        if target is None or target.status.value in _UNFINISHED:
            status = target.status.value if target is not None else "missing"
            raise TransitionRefused(
                key_of[step], "restart", status, "a pending or running step is not restarted"
            )
        for name in later:
            info = infos.get(key_of[name])
            if info is not None and info.status is TaskStatus.RUNNING:
                raise TransitionRefused(
                    info.key, "restart", "running", f"step {name!r} depends on {step!r} and runs"
                )
        finished = (_SUCCEEDED, _FAILED, _CANCELLED, _EXPIRED)
        for name in reversed(later):  # the last first: none of them starts before its needs
            info = infos.get(key_of[name])
            if info is not None and info.status.value in finished:
                await self._control(info.key, "restart", finished, "a finished step is restarted", by=by)
        if later:
            await self.driver.reset_steps(ResetStepsParams([key_of[n] for n in later], await self._now()))
        await self._control(target.key, "restart", finished, "a finished step is restarted", by=by)
        if target.items is not None:  # a map step fans out again (its source has succeeded)
            await self.driver.reset_steps(ResetStepsParams([target.key], await self._now()))
        await sync_families(self.driver, [parent.key], await self._now())
        return await self.workflow(parent.key)

    async def _remove_child(self, key: str, force: bool, by: str | None = None) -> None:
        doc = await self.driver.get_task(key)
        for item in map_items(doc) if doc is not None else []:  # a map step: its items first
            await self._remove_child(item, force, by)
        if force:
            try:
                await self._control(key, "cancel", (_RUNNING,), "", reason="removed", by=by)
            except (TransitionRefused, UnknownTask):
                pass
        rule = "a task with a running child is removed only with force=True"
        try:
            await self._control(key, "remove", _NOT_RUNNING, rule, by=by)
        except UnknownTask:
            pass

    async def _change(
        self,
        key: str,
        action: str,
        statuses: tuple[str, ...],
        rule: str,
        *,
        reason: str = "",
        stop_running: bool = False,
        by: str | None = None,
        deadline: datetime | None = None,
    ) -> TaskInfo:
        """``_control`` of an action that keeps the task: the task as it is after the change."""
        info = await self._control(
            key, action, statuses, rule, reason=reason, stop_running=stop_running, by=by, deadline=deadline
        )
        assert info is not None
        return await self._follow_family(info, action, reason=reason, stop_running=stop_running, by=by)

    async def _control(
        self,
        key: str,
        action: str,
        statuses: tuple[str, ...],
        rule: str,
        *,
        reason: str = "",
        stop_running: bool = False,
        by: str | None = None,
        deadline: datetime | None = None,
    ) -> TaskInfo | None:
        """One compare-and-set of ``action`` while the task's status is one of ``statuses``;
        ``UnknownTask`` / ``TransitionRefused`` (with ``rule``) when it does not apply."""
        key = _checked(validate_key, key, "key")
        for _ in range(CONTROL_TRIES):
            now = await self._now()
            params = ControlParams(key, action, statuses, now, reason, stop_running, by, deadline)
            after = await self.driver.control_task(params)
            if after is not None:
                # the task as this change left it (a later change may have moved it on since)
                return None if action == "remove" else TaskInfo.from_storage(after)
            doc = await self.driver.get_task(key)
            if doc is None:
                raise UnknownTask(key)
            status = doc["state"]["status"]
            if status not in statuses:
                raise TransitionRefused(key, action, status, rule)
            live = live_attempts(doc["state"], now) if action == "restart" else []
            if live:  # never twice at once: the attempt must settle first (docs/design.md)
                raise TransitionRefused(key, action, status, _still_running(live[0]))
        raise StorageError(f"task {key!r} kept changing under {CONTROL_TRIES} tries; try again")

    # -- plans --------------------------------------------------------------------------------

    async def add_plan(self, plan: Plan) -> PlanInfo:
        """Create a plan; raises ``InvalidInput`` (nothing written) if its id is taken."""
        if not isinstance(plan, Plan):
            raise InvalidInput(f"add_plan() takes a Plan, got {type(plan).__name__}")
        checked_params_size(plan.params, self.max_params_bytes, f"plan {plan.plan_id!r}")
        if not self._plans_set_up:  # the plans' indexes, before the first plan (as a publisher does)
            await self.driver.prepare()
            self._plans_set_up = True
        now = await self._now()
        doc = plan.to_storage(now)
        if not await self.driver.insert_plan(InsertPlanParams(doc, now)):
            raise InvalidInput(f"plan_id: a plan with id {plan.plan_id!r} exists already")
        await warn_if_unhandled(self.driver, [plan.name], now, log)  # as send does
        return PlanInfo.from_storage(doc)

    async def get_plan(self, plan_id: str) -> PlanInfo:
        """The plan, with its last run's current status; raises ``UnknownPlan``."""
        plan_id = checked_plan_id(plan_id)
        doc = await self.driver.get_plan(plan_id)
        if doc is None:
            raise UnknownPlan(plan_id)
        key = doc.get("last_run_key")
        if key is not None and not doc.get("last_run_seen", True):
            outcome = (await self.driver.get_run_outcomes([key])).get(key)
            doc["last_run_status"] = (
                run_status_of(plan_id, outcome.status, outcome.plan_id) if outcome is not None else "missing"
            )
        return PlanInfo.from_storage(doc)

    async def list_plans(
        self, *, state: str | None = None, limit: int = 100, skip: int = 0
    ) -> list[PlanInfo]:
        """Plans oldest first, optionally of one state (served by an index)."""
        state = checked_plan_listing(state, limit, skip)
        docs = await self.driver.list_plans(PlanListParams(state=state, limit=limit, skip=skip))
        return [PlanInfo.from_storage(doc) for doc in docs]

    async def run_plan_now(self, plan_id: str) -> TaskInfo:
        """Run the plan's task once, now, outside its schedule: a task like its occurrences
        (name, params, option; keyed as the occurrence at this instant, so it lists with the
        plan's runs and its events name the plan). The schedule, the counters and the last run
        stay as they are. Refused when the plan does not allow overlap and its last run is still
        pending or running."""
        plan_id = checked_plan_id(plan_id)
        doc = await self.driver.get_plan(plan_id)
        if doc is None:
            raise UnknownPlan(plan_id)
        last = doc.get("last_run_key")
        if last is not None and not doc["allow_overlap"]:
            outcome = (await self.driver.get_run_outcomes([last])).get(last)
            if outcome is not None and outcome.status in _UNFINISHED:
                rule = f"plan {plan_id!r} does not allow overlap"
                raise TransitionRefused(last, "start another run beside", outcome.status, rule)
        now = await self._now()
        key = occurrence_key(plan_id, now)
        documents = run_documents(plan_id, now, doc["task"])  # a task, or a workflow (parent first)
        (created, *_) = await self.driver.insert_tasks(InsertParams(documents, now))
        if not created:
            raise TransitionRefused(key, "run now", "pending", "a run of the plan at this instant exists")
        return await self.get_task(key)

    async def suspend_plan(self, plan_id: str) -> PlanInfo:
        """Suspend a plan: no occurrence is materialised until ``resume_plan``."""
        return await self._change_plan(plan_id, lambda doc, now: {"suspended": True})

    async def resume_plan(self, plan_id: str) -> PlanInfo:
        """Resume a suspended plan, or one parked in the error state (its failure streak is reset).
        Occurrences that fell due meanwhile follow the plan's catch-up policy, as after an outage."""
        return await self._change_plan(
            plan_id, lambda doc, now: {"suspended": False, "error": False, "consecutive_failures": 0}
        )

    async def skip_plan(self, plan_id: str, n: int = 1) -> PlanInfo:
        """Skip the plan's next ``n`` occurrences (sets the count: 0 cancels earlier skips)."""
        n = checked_skip_count(n)
        return await self._change_plan(plan_id, lambda doc, now: {"skip_next": n})

    async def edit_plan(self, plan_id: str, **changes: Any) -> PlanInfo:
        """Change a plan's definition: ``name``, ``params``, ``option``, ``timing``,
        ``allow_overlap``, ``max_consecutive_failures``. A new timing recomputes the next fire
        time from now; counters are kept. Validated as a whole (``InvalidInput``, nothing written)."""
        for field in ("plan_id", "suspended"):
            if field in changes:
                hint = "remove and re-add it" if field == "plan_id" else "use suspend_plan / resume_plan"
                raise InvalidInput(f"{field}: cannot be edited ({hint})")

        def change(doc: dict[str, Any], now: datetime) -> dict[str, Any]:
            current = PlanInfo.from_storage(doc).as_plan()
            edited = Plan(**(current.model_dump() | changes))
            checked_params_size(edited.params, self.max_params_bytes, f"plan {plan_id!r}")
            fields: dict[str, Any] = {
                "task": {
                    "name": edited.name,
                    "params": edited.params,
                    "option": option_to_storage(edited.option),
                },
                "timing": to_storage_dict(edited.timing),
                "allow_overlap": edited.allow_overlap,
                "max_consecutive_failures": edited.max_consecutive_failures,
            }
            if "timing" in changes and not doc["awaiting"]:
                fields["next_fire_time"] = refire_time(edited.timing, now)
            return fields

        info = await self._change_plan(plan_id, change)
        if "name" in changes:
            await warn_if_unhandled(self.driver, [info.name], await self._now(), log)
        return info

    async def remove_plan(self, plan_id: str) -> None:
        """Delete a plan (tasks it already made stay); raises ``UnknownPlan``."""
        plan_id = checked_plan_id(plan_id)
        if not await self.driver.delete_plan(plan_id):
            raise UnknownPlan(plan_id)

    async def _change_plan(
        self, plan_id: str, change: Callable[[dict[str, Any], datetime], dict[str, Any]]
    ) -> PlanInfo:
        """Read, change, compare-and-set on the version (again if a planner wrote meanwhile)."""
        plan_id = checked_plan_id(plan_id)
        for _ in range(PLAN_CHANGE_TRIES):
            doc = await self.driver.get_plan(plan_id)
            if doc is None:
                raise UnknownPlan(plan_id)
            now = await self._now()
            fields = change(doc, now)
            merged = doc | fields
            state = plan_state(
                suspended=merged["suspended"],
                error=merged["error"],
                awaiting=merged["awaiting"],
                next_fire_time=merged["next_fire_time"],
            )
            if state is PlanState.ACTIVE:
                due = merged["next_fire_time"]
            elif state is PlanState.AWAITING_COMPLETION:
                due = now  # look at its run at the next pass
            else:
                due = None
            fields |= {"state": state.value, "due_time": due, "version": doc["version"] + 1}
            if await self.driver.update_plan(UpdatePlanParams(plan_id, doc["version"], fields, now)):
                return PlanInfo.from_storage(doc | fields | {"update_time": now})
        raise StorageError(f"plan {plan_id!r} kept changing under {PLAN_CHANGE_TRIES} tries; try again")


async def change_option(
    driver: Driver, key: str, change: OptionChange, now: datetime, *, by: str | None = None
) -> TaskOption:
    """The live option change, the one definition ``Publisher.update_option`` and
    ``Operations.edit`` share: merged and validated as a whole, then one pipeline update that
    re-derives the state. Removing a running worker from ``specific_worker_ids`` stops it at its
    next ping; a new ``ping_interval`` applies from the next ping; the rest from the next claim."""
    doc = await driver.get_task(_checked(validate_key, key, "key"))
    if doc is None:
        raise UnknownTask(key)
    info = TaskInfo.from_storage(doc)
    if not isinstance(change, OptionChange):
        raise InvalidInput(f"change: an OptionChange, got {type(change).__name__}")
    try:
        option = change.apply(info.option)
    except InvalidInput as exc:
        raise InvalidInput(f"invalid option change for {key!r}: {exc}") from exc
    except ValidationError as exc:  # where and why, without pydantic's links or the values
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {error_reason(e)}" for e in exc.errors(include_url=False)
        )
        raise InvalidInput(f"invalid option change for {key!r}: {reasons}") from exc
    stored = option.to_storage(info.create_time)
    try:
        if not await driver.update_option(UpdateOptionParams(key, stored, now, by)):
            raise UnknownTask(key)
    except UniqueParamsTaken as exc:  # a finished task made live again while its params are taken
        held = f"live task {exc.holder!r}" if exc.holder else "a live task"
        raise TransitionRefused(key, "edit", info.status.value, f"{held} has the same params") from None
    return option


def _still_running(entry: Mapping[str, Any]) -> str:
    """Why a restart waits: the attempt that still holds a live lease, named."""
    return (
        f"attempt {entry['attempt']} of worker {entry['worker_id']!r} still holds a live lease "
        f"(until {entry['ping_expire_time'].isoformat()}): it is settled once its handler stops, "
        "within a ping interval of a cancel, or at that lease's end; restart it then"
    )


def check_handled(
    doc: NewTask,
    handler: HandlerInfo | None,
    handlers: Mapping[str, HandlerInfo],
    allow_unknown: bool,
    single: bool,
) -> None:
    """The door's rule for one task: a live worker handles its name (unless ``allow_unknown``),
    and its params conform to one of the schemas published for the name (any live worker that
    publishes none accepts anything)."""
    where = "" if single else f"task {doc.key!r}: "
    if handler is None:
        if allow_unknown:
            return
        known = sorted(handlers)
        shown = ", ".join(known[:KNOWN_NAMES_SHOWN]) + (
            f" and {len(known) - KNOWN_NAMES_SHOWN} more" if len(known) > KNOWN_NAMES_SHOWN else ""
        )
        raise InvalidInput(
            f"{where}no live worker handles tasks named {doc.name!r} "
            + (f"(names handled now: {shown})" if known else "(no worker is running)")
            + "; if a worker for it is on its way, send it with allow_unknown=True",
            field="name",
        )
    if not handler.schemas or any(schema is None for schema in handler.schemas):
        return
    problems = []
    for schema in handler.schemas:
        assert schema is not None
        problems = schema_problems(schema, doc.params)
        if not problems:
            return
    field, why = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise InvalidInput(f"{where}invalid params for {doc.name!r}: {field}: {why}{more}", field=field)


def _schema_of(text: str | None) -> dict[str, Any] | None:
    try:
        schema = json.loads(text) if text else None
    except ValueError:
        return None
    return schema if isinstance(schema, dict) else None


def _distinct(schemas: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    seen: list[dict[str, Any] | None] = []
    for schema in schemas:
        if schema not in seen:
            seen.append(schema)
    return seen


async def live_handlers(driver: Driver, now: datetime) -> set[str]:
    """Task names that a live registered consumer (or executor) handles."""
    names: set[str] = set()
    # the live workers only, on their index: not the whole registry
    for worker in await driver.list_workers(WorkerListParams(now, live_since=now - WORKER_LIVENESS)):
        if worker.get("stop_time") is None and worker["last_seen"] >= now - WORKER_LIVENESS:
            names.update(worker["names"])
    return names


async def warn_if_unhandled(
    driver: Driver, names: Iterable[str], now: datetime, logger: logging.Logger
) -> None:
    """Warn for each of ``names`` no live consumer handles: its tasks (a plan's runs) would wait
    silently. A hint only: a store that cannot tell is not an error."""
    try:
        handled = await live_handlers(driver, now)
    except MSchedulerError:
        return
    for name in sorted(set(names) - handled):
        logger.warning(
            "no live worker handles tasks named %r: they wait until a consumer that registers "
            "a handler for that name starts",
            name,
            extra={"task_name": name},
        )


# -- input checks, shared with ``mscheduler.remote.client.RemoteOperations`` (which runs them before
# a request, so that a refusal reads the same whichever way the CLI reaches the store) -------------


def checked_worker_id(worker_id: object) -> str:
    """A worker id as consumers take it: not starting with '$', nor with 'g:' (a group's claimer
    token: such an id would claim the tasks aimed at that group)."""
    try:
        return validate_worker_id(worker_id)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def limit_input(
    key: str, names: Sequence[str] | None, max_running: int | None, rate: Rate | str | None
) -> Limit:
    """The limit ``set_limit`` stores, or ``InvalidInput``."""
    if names is not None and (isinstance(names, (str, bytes)) or not isinstance(names, Sequence)):
        raise InvalidInput(f"names: a list of task names, got {type(names).__name__}")
    fields: dict[str, Any] = {"key": key, "max_running": max_running, "rate": rate}
    if names is not None:
        fields["names"] = tuple(names)
    return checked_limit(**fields)


def checked_reason(reason: object) -> str:
    if not isinstance(reason, str) or len(reason) > REASON_MAX:
        raise InvalidInput(f"reason: must be a string of at most {REASON_MAX} characters")
    return reason


def checked_mark(status: object, reason: object, by: object) -> None:
    """``set_status``'s input: a status that may be set by hand, a reason, who did it."""
    if status not in MARKABLE:
        raise InvalidInput(f"status: one of {', '.join(MARKABLE)}, got {status!r}")
    _check_text(reason, "reason", REASON_MAX)
    _check_text(by, "by", 200)


def child_key_of(info: TaskInfo, child: str) -> str:
    """The key of the child named ``child`` of the task ``info``, or ``InvalidInput``."""
    if info.children is None:
        raise InvalidInput(f"task {info.key!r} has no children")
    for entry in info.children:
        if entry.name == child:
            return entry.key
    names = ", ".join(repr(c.name) for c in info.children)
    raise InvalidInput(f"task {info.key!r} has no child named {child!r} (its children: {names})")


def checked_plan_listing(state: str | None, limit: object, skip: object) -> str | None:
    """``list_plans``' filters: the state's value (None: all), a page size, an offset."""
    if state is not None:
        try:
            state = PlanState(state).value
        except ValueError:
            choices = ", ".join(s.value for s in PlanState)
            raise InvalidInput(f"state: unknown plan state {state!r} (one of {choices})") from None
    if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidInput(f"limit: must be an integer from 1 to {LIST_LIMIT_MAX}")
    if not isinstance(skip, int) or skip < 0:
        raise InvalidInput("skip: must be a non-negative integer")
    return state


def checked_skip_count(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 10**9:
        raise InvalidInput("n: must be an integer from 0 to 1,000,000,000")
    return n


async def restart_each(
    keys: list[str], restart: Callable[[str], Awaitable[TaskInfo]]
) -> dict[str, RestartOutcome]:
    """``restart`` of each of ``keys`` (checked already), ``MANY_AT_ONCE`` at a time: the outcome
    per key, in their order (``restart_many`` of ``Operations`` and of the API's client)."""
    outcomes: dict[str, RestartOutcome] = {}

    async def one(key: str) -> None:
        try:
            outcomes[key] = RestartOutcome(key, "restarted", task=await restart(key))
        except TransitionRefused as exc:
            outcomes[key] = RestartOutcome(key, "refused", status=exc.status, rule=exc.rule)
        except UnknownTask:
            outcomes[key] = RestartOutcome(key, "unknown")

    for start in range(0, len(keys), MANY_AT_ONCE):
        await asyncio.gather(*(one(key) for key in keys[start : start + MANY_AT_ONCE]))
    return {key: outcomes[key] for key in keys}


def checked_keys(keys: object) -> list[str]:
    """Distinct valid keys, in the order given (at most ``MANY_MAX``); else ``InvalidInput``."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise InvalidInput(f"keys: a list of task keys, got {type(keys).__name__}")
    checked = list(dict.fromkeys(_checked(validate_key, key, f"keys[{i}]") for i, key in enumerate(keys)))
    if len(checked) > MANY_MAX:
        raise InvalidInput(f"keys: at most {MANY_MAX} keys at once, got {len(checked)}")
    return checked


def _limit_key(key: object) -> str:
    return validate_name(key)


def _checked(validate: Any, value: object, field: str) -> Any:
    try:
        return validate(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from exc


def _check_text(value: object, field: str, limit: int) -> None:
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidInput(f"{field}: must be a string of at most {limit} characters")
