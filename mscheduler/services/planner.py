"""The planner: a small service that turns plans' due occurrences into ordinary tasks.

There is no singleton: every consumer may run one (a supervised side task) and so may
``mscheduler planner``; they share the work by racing, safely:

* an occurrence's task key is derived from (plan id, fire time) (``occurrence_key``), so the
  unique key index makes a second task for the same occurrence impossible, however many
  planners insert it;
* advancing a plan is a compare-and-set on the ``version`` and ``next_fire_time`` the planner
  read; a planner that loses it changes nothing (its task inserts were duplicates or the same
  occurrences the winner made).

One pass (``run_once``) per batch of due plans: one read of the plans, one read of their previous
runs' statuses (only those whose outcome is not known yet), one ``insert_tasks`` of every
occurrence of the batch, one bulk compare-and-set — O(1) commands per batch, not per plan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.clock import Clock, SystemClock
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import TERMINAL_STATUSES, TaskStatus
from mscheduler.domain.plans import (
    TAKEN_RUN_STATUS,
    PlanState,
    occurrence_key,
    plan_state,
    run_status_of,
    timing_from_storage,
)
from mscheduler.domain.schedule import PlanProgress, next_fire_after_completion, plan_step, utc_ms
from mscheduler.drivers.base import (
    AdvancePlansParams,
    Driver,
    DuePlansParams,
    InsertParams,
    NewTask,
    PlanAdvance,
    RunOutcome,
)
from mscheduler.publishing import run_documents
from mscheduler.services.base import PeriodicService

log = logging.getLogger("mscheduler.planner")

DEFAULT_BATCH = 500
DEFAULT_INTERVAL = 1.0
# How often a plan waiting for its previous run (no overlap, or after_completion) is looked at.
DEFAULT_RECHECK = 5.0
# Batches one run_once reads at most (a full batch means more may be due).
MAX_ROUNDS = 100
_TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)
_UNFINISHED = frozenset((TaskStatus.PENDING.value, TaskStatus.RUNNING.value))


@dataclass(slots=True, frozen=True)
class PlanDecision:
    """What one planner step does to one plan: the tasks to insert and the compare-and-set."""

    tasks: tuple[NewTask, ...]
    advance: PlanAdvance


def needs_outcome(doc: Mapping[str, Any]) -> bool:
    """Does the step need the previous run's status (its outcome is not recorded yet)?"""
    return doc.get("last_run_key") is not None and not doc.get("last_run_seen", True)


def decide(
    doc: Mapping[str, Any], outcome: RunOutcome | None, now: datetime, *, recheck: timedelta
) -> PlanDecision:
    """One plan's step (pure): record the previous run's outcome, apply the failure-streak,
    overlap and after-completion rules, then ``plan_step``; ``outcome`` is the previous run's task
    (None if ``needs_outcome`` is False, or the task is gone)."""
    fields: dict[str, Any] = {}
    consecutive, running, run_end, taken = _record_outcome(doc, outcome, now, fields)
    error = bool(doc.get("error")) or taken or consecutive >= doc["max_consecutive_failures"]
    awaiting: bool = doc["awaiting"]
    next_fire: datetime | None = doc["next_fire_time"]
    runs: int = doc["runs_made"]
    skip_next: int = doc["skip_next"]
    skipped: int = doc["skipped_cnt"]
    due: datetime | None = None
    tasks: list[NewTask] = []
    try:
        timing = timing_from_storage(doc["timing"])
    except InvalidInput as exc:  # edited by hand into something invalid: park it, say why
        log.error("plan %s: stored timing is invalid (%s); parked in the error state", doc["plan_id"], exc)
        timing, error = None, True

    if timing is not None and not error:
        if awaiting and running:
            due = now + recheck
        elif awaiting:
            awaiting = False
            next_fire = next_fire_after_completion(timing, runs, run_end or now)
        if not awaiting and next_fire is not None:
            if running and not doc["allow_overlap"] and next_fire <= now:
                due = now + recheck  # the previous run is still going: wait, then catch up
            else:
                step = plan_step(
                    timing, PlanProgress(runs_made=runs, next_fire_time=next_fire, skip_next=skip_next), now
                )
                fire_times = step.fire_times
                next_fire, runs, skip_next = step.next_fire_time, step.runs_made, step.skip_next
                if len(fire_times) > 1 and not doc["allow_overlap"]:
                    # One run at a time, catch-up included: the first due occurrence now, the
                    # next when this run has ended (the plan stays due at the next fire time,
                    # which the overlap rule above holds back while the run is pending or
                    # running). Skips consumed by the step all came before its first fire time.
                    fire_times, next_fire, runs = fire_times[:1], fire_times[1], runs - len(fire_times) + 1
                skipped += step.skipped_cnt
                awaiting = step.awaiting_completion
                if fire_times:
                    tasks = [
                        t for fire in fire_times for t in run_documents(doc["plan_id"], fire, doc["task"])
                    ]
                    fields.update(
                        last_run_key=occurrence_key(doc["plan_id"], fire_times[-1]),
                        last_run_fire_time=fire_times[-1],
                        last_run_status=TaskStatus.PENDING.value,
                        last_run_seen=False,
                        last_run_end_time=None,
                    )

    state = plan_state(suspended=doc["suspended"], error=error, awaiting=awaiting, next_fire_time=next_fire)
    if state is PlanState.ACTIVE:
        due = due if due is not None else next_fire
    elif state is PlanState.AWAITING_COMPLETION:
        due = due if due is not None else now + recheck
    else:
        due = None
    fields.update(
        next_fire_time=next_fire,
        runs_made=runs,
        skip_next=skip_next,
        skipped_cnt=skipped,
        awaiting=awaiting,
        error=error,
        consecutive_failures=consecutive,
        state=state.value,
        due_time=due,
        version=doc["version"] + 1,
    )
    return PlanDecision(
        tuple(tasks), PlanAdvance(doc["plan_id"], doc["version"], doc["next_fire_time"], fields)
    )


def _record_outcome(
    doc: Mapping[str, Any], outcome: RunOutcome | None, now: datetime, fields: dict[str, Any]
) -> tuple[int, bool, datetime | None, bool]:
    """The previous run's outcome into ``fields`` (when the step needs it): the failure streak
    after it, whether the run is still pending or running, when it ended, and whether its key
    is held by a task the plan did not make (the plan is then parked in the error state)."""
    consecutive: int = doc["consecutive_failures"]
    running = taken = False
    run_end: datetime | None = doc.get("last_run_end_time")
    if not needs_outcome(doc):
        return consecutive, running, run_end, taken
    if outcome is None:  # the task was removed: its outcome will never be known
        fields.update(last_run_status="missing", last_run_seen=True, last_run_end_time=now)
        run_end = now
    elif run_status_of(doc["plan_id"], outcome.status, outcome.plan_id) == TAKEN_RUN_STATUS:
        # a task the plan did not make holds its run's key: never taken for the plan's run
        log.error(
            "plan %s: its run's key %s is held by a task the plan did not make; parked in the "
            "error state (remove that task, then resume the plan)",
            doc["plan_id"],
            outcome.key,
        )
        fields.update(last_run_status=TAKEN_RUN_STATUS, last_run_seen=True, last_run_end_time=now)
        run_end, taken = now, True
    elif outcome.status in _TERMINAL:
        run_end = outcome.end_time or now
        fields.update(last_run_status=outcome.status, last_run_seen=True, last_run_end_time=run_end)
        if outcome.status == TaskStatus.FAILED.value:
            consecutive += 1
        elif outcome.status == TaskStatus.SUCCEEDED.value:
            consecutive = 0
    else:
        running = outcome.status in _UNFINISHED
        fields["last_run_status"] = outcome.status
    return consecutive, running, run_end, taken
    if outcome is None:  # the task was removed: its outcome will never be known
        fields.update(last_run_status="missing", last_run_seen=True, last_run_end_time=now)
        run_end = now
    elif outcome.status in _TERMINAL:
        run_end = outcome.end_time or now
        fields.update(last_run_status=outcome.status, last_run_seen=True, last_run_end_time=run_end)
        if outcome.status == TaskStatus.FAILED.value:
            consecutive += 1
        elif outcome.status == TaskStatus.SUCCEEDED.value:
            consecutive = 0
    else:
        running = outcome.status in _UNFINISHED
        fields["last_run_status"] = outcome.status
    return consecutive, running, run_end


class Planner(PeriodicService):
    """Materialises due occurrences of plans as tasks; run any number of them at once.

    :param driver: the storage.
    :param clock: time source (a consumer passes its server-corrected clock; tests a FakeClock).
    :param batch: plans read per batch (one read, one insert, one bulk compare-and-set each).
    :param interval: seconds between passes of ``run``.
    :param recheck: seconds between looks at a plan waiting for its previous run to end.
    :param on_created: told of the tasks each pass created (a consumer hosting the planner queues
        their due times itself: on a store without change streams they would wait for a poll).
    """

    what = "planner"

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        batch: int = DEFAULT_BATCH,
        interval: float = DEFAULT_INTERVAL,
        recheck: float = DEFAULT_RECHECK,
        max_rounds: int = MAX_ROUNDS,
        on_created: Callable[[Sequence[NewTask]], None] | None = None,
    ) -> None:
        if not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise InvalidInput("batch: must be an integer from 1 to 10,000")
        if not 0 < interval <= 3600:
            raise InvalidInput("interval: must be more than 0 and at most 3600 seconds")
        if not 0 < recheck <= 3600:
            raise InvalidInput("recheck: must be more than 0 and at most 3600 seconds")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise InvalidInput("max_rounds: must be a positive integer")
        self.driver = driver
        self.clock: Clock = clock or SystemClock()
        self.batch = batch
        self.interval = interval
        self.recheck = timedelta(seconds=recheck)
        self.max_rounds = max_rounds
        self.on_created = on_created
        self.materialised = 0  # occurrence tasks this planner created (inserts that were new)
        self.conflicts = 0  # compare-and-sets lost to another planner or a user's edit
        self.passes = 0
        self._stopping = asyncio.Event()

    async def run_once(self, now: datetime | None = None) -> int:
        """One pass over the plans due at ``now`` (default: the clock's); returns how many
        occurrence tasks it created (duplicates another planner made first are not counted)."""
        now = utc_ms(now if now is not None else self.clock.now())
        created = 0
        for _ in range(self.max_rounds):
            docs = await self.driver.find_due_plans(DuePlansParams(now, self.batch))
            if not docs:
                break
            created += await self._step(docs, now)
            if len(docs) < self.batch:
                break
        self.passes += 1
        self.materialised += created
        return created

    async def _step(self, docs: Sequence[Mapping[str, Any]], now: datetime) -> int:
        keys = [doc["last_run_key"] for doc in docs if needs_outcome(doc)]
        outcomes = await self.driver.get_run_outcomes(keys) if keys else {}
        decisions = []
        for doc in docs:
            outcome = outcomes.get(doc["last_run_key"]) if needs_outcome(doc) else None
            decisions.append(decide(doc, outcome, now, recheck=self.recheck))
        tasks = [task for d in decisions for task in d.tasks]
        created = 0
        if tasks:
            # First the tasks (idempotent by key), then the plans: a planner that dies in
            # between leaves the plans due, and the next pass inserts the same keys again.
            inserted = await self.driver.insert_tasks(InsertParams(tasks, now))
            created = sum(  # runs, not steps
                new for new, task in zip(inserted, tasks, strict=True) if task.parent is None
            )
            if self.on_created is not None and any(inserted):
                self.on_created([task for task, new in zip(tasks, inserted, strict=True) if new])
        applied = await self.driver.advance_plans(AdvancePlansParams([d.advance for d in decisions], now))
        self.conflicts += len(decisions) - applied
        return created
