"""Domain operations for operators: the one API that Python code, the CLI, the REST API and the
dashboard call to look at and steer the scheduler. No rule and no query is written twice: each
operation validates its input, takes the time from the server-corrected clock, and calls one
named driver operation.

Workers (list, remote stop), tasks (get, list, count; cancel, pause, resume, remove, restart) and
plans. Each task control is one compare-and-set in the store on the task's status: it is applied
whole or refused (``TransitionRefused``, nothing changed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from mscheduler.clock import Clock, ServerClock
from mscheduler.drivers.base import (
    ControlParams,
    Driver,
    InsertPlanParams,
    ListParams,
    PlanListParams,
    UpdateOptionParams,
    UpdatePlanParams,
)
from mscheduler.exceptions import InvalidInput, StorageError, TransitionRefused, UnknownPlan, UnknownTask
from mscheduler.model import OptionChange, TaskInfo, TaskOption, TaskStatus, validate_key, validate_name
from mscheduler.plans import (
    Plan,
    PlanInfo,
    PlanState,
    checked_plan_id,
    option_to_storage,
    plan_state,
    refire_time,
)
from mscheduler.schedule import to_storage_dict

LIST_LIMIT_MAX = 1000
PLAN_CHANGE_TRIES = 10  # compare-and-set tries of a plan change racing planners
CONTROL_TRIES = 10  # a task control refused, but the task's status allows it on re-read: again
REASON_MAX = 2000

_PENDING, _RUNNING = TaskStatus.PENDING.value, TaskStatus.RUNNING.value
_SUCCEEDED, _FAILED = TaskStatus.SUCCEEDED.value, TaskStatus.FAILED.value
_EXPIRED, _CANCELLED = TaskStatus.EXPIRED.value, TaskStatus.CANCELLED.value
_UNFINISHED = (_PENDING, _RUNNING)
_NOT_RUNNING = tuple(s.value for s in TaskStatus if s is not TaskStatus.RUNNING)
# A worker whose last heartbeat is older than this is reported as not live.
WORKER_LIVENESS = timedelta(seconds=30)


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


class Operations:
    """Operator operations over one store.

    :param driver: the storage.
    :param clock: time source; by default the system clock corrected to the server's clock (the
        same correction consumers use, so a stop request is stamped in the server's time).
    """

    def __init__(self, driver: Driver, *, clock: Clock | None = None) -> None:
        self.driver = driver
        self.clock = clock if isinstance(clock, ServerClock) else ServerClock(clock)
        self._synced = False
        self._plans_set_up = False

    async def _now(self) -> datetime:
        if not self._synced:
            await self.clock.sync(self.driver.server_time)
            self._synced = True
        return self.clock.now()

    # -- workers ------------------------------------------------------------------------------

    async def list_workers(self) -> list[WorkerView]:
        """Every registered consumer, oldest first, with whether it is live."""
        now = await self._now()
        views = []
        for w in await self.driver.list_workers():
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
                )
            )
        return sorted(views, key=lambda v: (v.start_time, v.worker_id))

    async def request_worker_stop(self, worker_id: str) -> bool:
        """Ask a running consumer to stop gracefully (it sees the request at its next heartbeat).
        False if no running consumer has that id (unknown, or stopped already)."""
        if not isinstance(worker_id, str) or not worker_id or worker_id.startswith("$"):
            raise InvalidInput(f"invalid worker id {worker_id!r}")
        return await self.driver.request_worker_stop(worker_id, await self._now())

    # -- tasks --------------------------------------------------------------------------------

    async def get_task(self, key: str) -> TaskInfo:
        """The task as stored; raises ``UnknownTask``."""
        doc = await self.driver.get_task(_checked(validate_key, key, "key"))
        if doc is None:
            raise UnknownTask(key)
        return TaskInfo.from_storage(doc)

    async def list_tasks(
        self, *, status: str | None = None, name: str | None = None, limit: int = 100, skip: int = 0
    ) -> list[TaskInfo]:
        """Tasks oldest first, filtered by status and / or name (each served by an index)."""
        if status is not None:
            try:
                status = TaskStatus(status).value
            except ValueError:
                choices = ", ".join(s.value for s in TaskStatus)
                raise InvalidInput(f"status: unknown status {status!r} (one of {choices})") from None
        if name is not None:
            name = _checked(validate_name, name, "name")
        if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidInput(f"limit: must be an integer from 1 to {LIST_LIMIT_MAX}")
        if not isinstance(skip, int) or skip < 0:
            raise InvalidInput("skip: must be a non-negative integer")
        docs = await self.driver.list_tasks(ListParams(status=status, name=name, limit=limit, skip=skip))
        return [TaskInfo.from_storage(doc) for doc in docs]

    async def count_by_status(self) -> dict[str, int]:
        """How many tasks are in each status (statuses with none are 0)."""
        counts = await self.driver.count_by_status()
        return {s.value: counts.get(s.value, 0) for s in TaskStatus}

    # -- task control -------------------------------------------------------------------------

    async def cancel(self, key: str, reason: str = "") -> TaskInfo:
        """End a pending or running task as ``cancelled`` (terminal). A running handler is
        cancelled at its next ping and its outcome is refused; ``wait`` raises ``TaskCancelled``.
        Refused on a finished task (succeeded, failed, expired, cancelled)."""
        if not isinstance(reason, str) or len(reason) > REASON_MAX:
            raise InvalidInput(f"reason: must be a string of at most {REASON_MAX} characters")
        rule = "only a pending or running task can be cancelled"
        return await self._change(key, "cancel", _UNFINISHED, rule, reason=reason)

    async def pause(self, key: str) -> TaskInfo:
        """Stop claims of a pending or running task until ``resume`` (a running attempt runs on);
        its status stays. Refused on a finished task."""
        return await self._change(key, "pause", _UNFINISHED, "a finished task cannot be paused")

    async def resume(self, key: str) -> TaskInfo:
        """Make a paused task claimable again. Refused on a finished task."""
        return await self._change(key, "resume", _UNFINISHED, "a finished task cannot be resumed")

    async def remove(self, key: str, *, force: bool = False) -> None:
        """Delete a task that is not running; a running one only with ``force=True`` (it is
        cancelled first, so its handler stops at its next ping)."""
        if force:
            try:
                await self._control(key, "cancel", (_RUNNING,), "", reason="removed")
            except TransitionRefused:
                pass  # not running (any more): removed below as it is
        rule = "a running task is removed only with force=True (it is cancelled first)"
        await self._control(key, "remove", _NOT_RUNNING, rule)

    async def restart(self, key: str, *, force: bool = False) -> TaskInfo:
        """Run a failed, cancelled or expired task again (a succeeded one only with
        ``force=True``; a pending or running one never): its attempts are kept in
        ``state.history`` as an earlier generation and the retry budget starts afresh. A
        deadline already past is dropped (it would expire the task again at once)."""
        statuses = (_FAILED, _CANCELLED, _EXPIRED, *((_SUCCEEDED,) if force else ()))
        rule = "only a failed, cancelled or expired task can be restarted" + (
            "" if force else " (a succeeded one with force=True)"
        )
        return await self._change(key, "restart", statuses, rule)

    async def edit(self, key: str, change: OptionChange) -> TaskOption:
        """Change a pending or running task's options (F26: due time, priority, retry budget or
        policy, targeting, ...) under the live-option rules of ``change_option``. Refused on a
        finished task (restart it instead)."""
        info = await self.get_task(key)
        if info.status.value not in _UNFINISHED:
            rule = "only a pending or running task can be edited (restart a finished one)"
            raise TransitionRefused(key, "edit", info.status.value, rule)
        return await change_option(self.driver, key, change, await self._now())

    async def _change(
        self, key: str, action: str, statuses: tuple[str, ...], rule: str, *, reason: str = ""
    ) -> TaskInfo:
        """``_control`` of an action that keeps the task: the task as it is after the change."""
        info = await self._control(key, action, statuses, rule, reason=reason)
        assert info is not None
        return info

    async def _control(
        self, key: str, action: str, statuses: tuple[str, ...], rule: str, *, reason: str = ""
    ) -> TaskInfo | None:
        """One compare-and-set of ``action`` while the task's status is one of ``statuses``;
        ``UnknownTask`` / ``TransitionRefused`` (with ``rule``) when it does not apply."""
        key = _checked(validate_key, key, "key")
        for _ in range(CONTROL_TRIES):
            now = await self._now()
            if await self.driver.control_task(ControlParams(key, action, statuses, now, reason)):
                if action == "remove":
                    return None
                doc = await self.driver.get_task(key)
                if doc is None:  # removed meanwhile
                    raise UnknownTask(key)
                return TaskInfo.from_storage(doc)
            doc = await self.driver.get_task(key)
            if doc is None:
                raise UnknownTask(key)
            status = doc["state"]["status"]
            if status not in statuses:
                raise TransitionRefused(key, action, status, rule)
        raise StorageError(f"task {key!r} kept changing under {CONTROL_TRIES} tries; try again")

    # -- plans --------------------------------------------------------------------------------

    async def add_plan(self, plan: Plan) -> PlanInfo:
        """Create a plan; raises ``InvalidInput`` (nothing written) if its id is taken."""
        if not isinstance(plan, Plan):
            raise InvalidInput(f"add_plan() takes a Plan, got {type(plan).__name__}")
        if not self._plans_set_up:  # the plans' indexes, before the first plan (as a publisher does)
            await self.driver.setup()
            self._plans_set_up = True
        now = await self._now()
        doc = plan.to_storage(now)
        if not await self.driver.insert_plan(InsertPlanParams(doc, now)):
            raise InvalidInput(f"plan_id: a plan with id {plan.plan_id!r} exists already")
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
            doc["last_run_status"] = outcome.status if outcome is not None else "missing"
        return PlanInfo.from_storage(doc)

    async def list_plans(
        self, *, state: str | None = None, limit: int = 100, skip: int = 0
    ) -> list[PlanInfo]:
        """Plans oldest first, optionally of one state (served by an index)."""
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
        docs = await self.driver.list_plans(PlanListParams(state=state, limit=limit, skip=skip))
        return [PlanInfo.from_storage(doc) for doc in docs]

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
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 10**9:
            raise InvalidInput("n: must be an integer from 0 to 1,000,000,000")
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

        return await self._change_plan(plan_id, change)

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


async def change_option(driver: Driver, key: str, change: OptionChange, now: datetime) -> TaskOption:
    """The live option change (SPEC F8), the one definition ``Publisher.update_option`` and
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
    except (InvalidInput, ValidationError) as exc:
        raise InvalidInput(f"invalid option change for {key!r}: {exc}") from exc
    stored = option.to_storage(info.create_time)
    if not await driver.update_option(UpdateOptionParams(key, stored, now)):
        raise UnknownTask(key)
    return option


def _checked(validate: Any, value: object, field: str) -> Any:
    try:
        return validate(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from exc
