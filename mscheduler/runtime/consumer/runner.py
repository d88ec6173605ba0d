"""Running a handler: what a claimed attempt becomes in this process.

``ConsumerRunner._execute`` calls the registered handler with its params (validated into the
handler's pydantic model) and a ``TaskContext``, under the task's ``run_timeout``; turns what the
handler did (returned, raised ``Retry`` / ``Snooze`` / ``Fail``, failed, was cancelled) into an
outcome by the shared rules (``mscheduler.domain.outcomes``); hands it to the finisher; and then does the
attempt's bookkeeping (stats, events, logs, the 'finished' listener event). ``RunningAttempt`` is an
attempt's state while it runs, shared by the claimer, the pinger and the finisher.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from mscheduler.domain.clock import ClockTimeout, ServerClock
from mscheduler.domain.exceptions import Fail, InvalidInput, MSchedulerError, Retry, Snooze
from mscheduler.domain.model import AttemptStatus, TaskOption
from mscheduler.domain.outcomes import Outcome, error_info
from mscheduler.domain.outcomes import fail_for_good as fail_outcome
from mscheduler.domain.outcomes import failed as failed_outcome
from mscheduler.domain.outcomes import rejected as rejected_outcome
from mscheduler.domain.outcomes import retry_after as retry_outcome
from mscheduler.domain.outcomes import snoozed as snoozed_outcome
from mscheduler.domain.outcomes import succeeded as succeeded_outcome
from mscheduler.drivers.base import ClaimedTask, FinishParams, cancelled_error, paused_error
from mscheduler.observability.tracing import TaskTracer
from mscheduler.runtime.consumer.discovery import Discovery
from mscheduler.runtime.consumer.handlers import Registered as _Registered
from mscheduler.runtime.consumer.inputs import StepInputs
from mscheduler.runtime.consumer.limiter import Limiter
from mscheduler.runtime.consumer.reports import AttemptReports
from mscheduler.services.events import EventKind, EventRecorder, outcome_detail, outcome_kind

log = logging.getLogger("mscheduler.consumer")

# attempt statuses as plain strings (read once per attempt: no enum lookups there)
_SUCCEEDED = AttemptStatus.SUCCEEDED.value
_RELEASED = AttemptStatus.RELEASED.value
_CANCELLED = AttemptStatus.CANCELLED.value
_FAILED_OR_REJECTED = (AttemptStatus.FAILED.value, AttemptStatus.REJECTED.value)

Listener = Callable[[str, dict[str, Any]], None]
LEASE_SAFETY_MARGIN = timedelta(milliseconds=500)
# Keys of untargeted fan-out tasks this worker ran, sent with each claim so that the store skips
# them on the claim index's keys; older ones fall back to the claim filter's check of the entries.
RAN_FANOUT_KEPT = 256
# a workflow step claimed while a step it needs is not succeeded (restarted meanwhile) is put
# back for this long (a snooze, not counted) and reads its inputs again then
NEEDS_RECHECK = timedelta(seconds=5)


class RunTimedOut(Exception):
    """An attempt ran longer than its task's ``run_timeout``: it fails and is retried by policy."""


@dataclass(slots=True)
class TaskContext:
    """What a handler may want to know about the attempt it runs, and how it saves its way.

    ``checkpoint_data``: what an earlier attempt of this task saved with ``checkpoint`` (None if
    nothing was saved): a handler resumes from it after a crash, a takeover, a retry or a pause.
    ``results``: a workflow step's inputs, the results of the steps it needs by name (a map
    step's: the list of its items' results, in order), read once when the attempt was claimed.
    """

    key: str
    name: str
    attempt: str
    attempt_no: int
    worker_id: str
    option: TaskOption
    checkpoint_data: Any = None
    _reports: AttemptReports | None = field(default=None, repr=False, compare=False)
    results: dict[str, Any] = field(default_factory=dict)
    _given_up: bool = field(default=False, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once this attempt was given up (cancelled, paused, lease lost or revoked, run
        timeout, stop): a handler in a thread or a process (which cannot be stopped from outside)
        polls it and returns; nothing it saves or returns afterwards is kept."""
        return self._given_up or (self._reports is not None and self._reports.closed is not None)

    def _give_up(self, reason: str) -> None:
        """The attempt is settled without its handler (see ``handlers``): flag it, close its reports."""
        self._given_up = True
        if self._reports is not None:
            self._reports.close(reason)

    async def checkpoint(self, data: Any) -> None:
        """Save ``data`` (JSON-like, at most ``Consumer(max_checkpoint_bytes=...)``) on the task,
        for the next attempt's ``checkpoint_data``; returns once it is stored. It rides the
        pinger's write (checkpoints of many handlers in one command). Raises ``InvalidInput``
        for data that cannot be stored and ``LeaseLost`` if this attempt no longer holds the
        task (lost, cancelled, paused): then nothing was saved."""
        if self._reports is None:
            raise InvalidInput("this TaskContext is not attached to a running attempt")
        await self._reports.save_checkpoint(data)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Record how far the attempt is (``0 <= fraction <= 1``, an optional message); written
        with the next ping or checkpoint, shown as ``TaskInfo.progress``. Only the newest value
        is written; one still unwritten when the attempt ends is dropped."""
        if self._reports is None:
            raise InvalidInput("this TaskContext is not attached to a running attempt")
        self._reports.set_progress(fraction, message)


@dataclass(slots=True)
class RunningAttempt:
    claimed: ClaimedTask
    option: dict[str, Any]
    expire: Any  # lease end as last confirmed by the store
    task: asyncio.Task[None] | None = None
    cancel_reason: str | None = None  # "lost", "revoked", "released", "cancelled", "paused"
    handler_done: bool = False
    reports: AttemptReports | None = None  # checkpoint / progress waiting for the next ping
    started: float = 0.0  # the clock's monotonic time at the claim (the 'finished' duration)
    slot: str | None = None  # the flow limit whose slot this attempt holds (mscheduler.domain.limits)

    @property
    def trust_until(self) -> Any:
        """When this worker stops trusting its lease: a little before its end (a tenth of the
        lease, at most LEASE_SAFETY_MARGIN), so that a takeover at the end never overlaps."""
        margin = min(LEASE_SAFETY_MARGIN, timedelta(milliseconds=self.option["worker_timeout_ms"] / 10))
        return self.expire - margin

    @property
    def trusted(self) -> bool:
        return self.cancel_reason is None and not self.handler_done

    def cancel(self, reason: str) -> None:
        """Cancel the handler for ``reason`` unless it ended or was cancelled already. Once it has
        returned, its outcome is being written: cancelling then would drop the attempt's
        bookkeeping (the ``_running`` entry, the 'finished' event)."""
        if self.task is None or self.task.done() or self.handler_done or self.cancel_reason is not None:
            return
        self.cancel_reason = reason
        if self.reports is not None:
            self.reports.close(reason)
        self.task.cancel()


class ConsumerRunner:
    """Running a handler, for ``Consumer`` (a mixin: it uses the consumer's registry, clock,
    limiter and bookkeeping, and the finisher's ``_submit_then``)."""

    _handlers: dict[str, _Registered]
    _running: dict[str, RunningAttempt]
    _ran_fanout: OrderedDict[str, None]
    _handlers_active: int
    _slot_freed: asyncio.Event
    _pending_added: asyncio.Event
    _ping_now: asyncio.Event
    _progress_set: asyncio.Event
    _listeners: list[Listener]
    clock: ServerClock
    limiter: Limiter
    discovery: Discovery | None
    events: EventRecorder | None
    worker_id: str
    max_result_bytes: int
    max_checkpoint_bytes: int
    rng: random.Random
    stats: dict[str, int]

    _tracer: TaskTracer | None
    inputs: StepInputs

    if TYPE_CHECKING:

        async def _submit(self, params: FinishParams, slot: str | None = None) -> bool: ...

        def _submit_then(
            self,
            params: FinishParams,
            slot: str | None,
            then: Callable[[bool, BaseException | None], None],
        ) -> None: ...

        def _emit(self, event: str, data: dict[str, Any]) -> None: ...

        @staticmethod
        def _fails_for_good(
            running: RunningAttempt, stat: str, error: dict[str, Any] | None, final: bool = False
        ) -> bool: ...

        def _record_event(
            self, running: RunningAttempt, kind: EventKind, detail: dict[str, Any] | None = None
        ) -> None: ...

    async def _execute(self, running: RunningAttempt) -> None:
        claimed = running.claimed
        registered = self._handlers[claimed.name]
        done: Outcome | None  # the shared outcome rules (mscheduler.domain.outcomes) build it
        result: Any = None
        run_timeout = running.option.get("run_timeout_ms")
        try:
            try:
                results = await self._step_results(claimed) if claimed.needs else None
                args = self._arguments(registered, claimed, running, results)
            except ValidationError as exc:
                done = rejected_outcome({"type": "InvalidParams", "message": str(exc), "traceback": None})
            else:
                if not run_timeout:
                    result = await registered.fn(*args)
                else:
                    try:  # on the consumer's clock, like every other time (FakeClock in tests)
                        async with ClockTimeout(self.clock, run_timeout / 1000) as deadline:
                            result = await registered.fn(*args)
                    except TimeoutError as exc:
                        if deadline.expired and running.cancel_reason is None:
                            message = f"the attempt ran longer than its run_timeout ({run_timeout} ms)"
                            raise RunTimedOut(message) from exc
                        raise
                done = succeeded_outcome(result, self.max_result_bytes)
        except Snooze as exc:
            done = snoozed_outcome(str(exc), exc.after, self.clock.now())
        except Retry as exc:
            done = retry_outcome(error_info(exc), exc.after, self.clock.now())
        except Fail as exc:
            done = fail_outcome(error_info(exc))
        except asyncio.CancelledError:
            reason = running.cancel_reason
            if reason is None:  # cancelled from outside our bookkeeping: treat as a release
                reason = "released"
            # lost: not ours any more, nothing to write. Cancelled (the task was) or paused (a
            # stopping pause): the handler has stopped now, so the attempt is settled, fenced
            # like any outcome: ``cancelled``, or ``released`` (not counted; docs/design.md).
            if reason == "lost":
                done = None
            elif reason == "cancelled":
                done = Outcome(AttemptStatus.CANCELLED.value, error=cancelled_error())
            elif reason == "paused":
                done = Outcome(AttemptStatus.RELEASED.value, error=paused_error())
            else:
                done = Outcome(
                    reason, error={"type": "Cancelled", "message": f"attempt {reason}", "traceback": None}
                )
        except Exception as exc:
            done = self._failed(running, error_info(exc))
        finally:
            running.handler_done = True
            self._handlers_active -= 1
            self._slot_freed.set()
        if done is None:  # lost: nothing to write
            self._settle(running, None, accepted=False, submitted=False)
            return
        params = FinishParams(
            claimed.key,
            self.worker_id,
            claimed.attempt,
            self.clock.now(),
            done.status,
            done.result,
            done.error,
            done.retry_at,
            done.final,
        )
        if self._tracer is not None:
            # traced: the run span covers the write and the bookkeeping (the 'finished' event,
            # emitted inside the attempt, sets the span's outcome), so the attempt waits for it
            try:
                accepted = await self._submit(params, running.slot)
            except MSchedulerError as exc:
                self._written(running, done, False, exc)
            else:
                self._written(running, done, accepted, None)
            return
        try:
            # the rest of the attempt's bookkeeping runs once the finisher wrote the outcome: the
            # handler's task ends here (no future, shield or wake-up of its own per attempt)
            self._submit_then(params, running.slot, partial(self._written, running, done))
        except MSchedulerError as exc:
            self._written(running, done, False, exc)

    def _written(
        self, running: RunningAttempt, done: Outcome, accepted: bool, error: BaseException | None
    ) -> None:
        """The finisher wrote ``done`` (``accepted``: the store took it), or could not (``error``)."""
        if error is not None:
            log.error(
                "could not record the outcome of %s: %s",
                running.claimed.key,
                error,
                extra=self._fields(running, error=str(error)),
            )
        self._settle(running, done, accepted=accepted and error is None, submitted=error is None)

    def _settle(
        self, running: RunningAttempt, done: Outcome | None, *, accepted: bool, submitted: bool
    ) -> None:
        """An attempt's bookkeeping once its outcome is written (``submitted``: the finisher
        released its slot with it) or there was none to write: stats, events, logs, listeners."""
        claimed = running.claimed
        outcome = done.status if done is not None else None
        error = done.error if done is not None else None
        retry_at, final = (done.retry_at, done.final) if done is not None else (None, False)
        if self._running.get(claimed.key) is running:
            del self._running[claimed.key]
        if running.slot is not None and not submitted:
            # no outcome sent (lost, or the write failed): the finisher releases the slot now
            self.limiter.release(running.slot, self.worker_id, claimed.attempt)
            self._pending_added.set()
        stat = outcome if accepted and outcome is not None else "lost"
        if running.cancel_reason == "paused":  # released by the pause: not a lost lease
            stat = _RELEASED
        elif running.cancel_reason == "cancelled":  # settled cancelled: nothing was lost
            stat = _CANCELLED
        option = running.option
        if (
            stat == _SUCCEEDED
            and option["concurrent_worker_cnt"] > 1
            and not option.get("same_worker_may_repeat")  # it may take that task again
        ):
            # tasks aimed at named workers leave our claimer token anyway; "anyone" and group
            # tokens do not say who ran the task
            if not option["specific_worker_ids"] or option.get("specific_groups"):
                self._ran_fanout[claimed.key] = None
                if len(self._ran_fanout) > RAN_FANOUT_KEPT:
                    self._ran_fanout.popitem(last=False)
        self.stats[stat] = self.stats.get(stat, 0) + 1
        if (
            accepted
            and retry_at is not None
            and self.discovery is not None
            and not self._fails_for_good(running, stat, error, final)
        ):
            # this consumer wrote the due time itself (a retry, a snooze): it wakes for it without
            # waiting for its next poll, where no change stream tells it
            self.discovery.due_at(claimed.key, retry_at)
        if self.events is not None and accepted:
            kind = outcome_kind(stat, self._fails_for_good(running, stat, error, final))
            if kind is not None:
                self._record_event(running, kind, outcome_detail(error, retry_at))
        self._log_outcome(running, stat, error, final)
        if self._listeners:
            self._emit(
                "finished",
                {
                    "key": claimed.key,
                    "attempt": claimed.attempt,
                    "outcome": stat,
                    "error": error,
                    "name": claimed.name,
                    "duration": self.clock.monotonic() - running.started,
                },
            )

    def _failed(self, running: RunningAttempt, error: dict[str, Any]) -> Outcome:
        """A plain failure, retried by the task's retry policy (the rule in mscheduler.domain.outcomes)."""
        return failed_outcome(
            error, running.option, running.claimed.failure_times, self.clock.now(), self.rng
        )

    def _fields(self, running: RunningAttempt, **more: Any) -> dict[str, Any]:
        """Structured fields for log records about an attempt (``extra=``)."""
        claimed = running.claimed
        return {
            "key": claimed.key,
            "task_name": claimed.name,
            "attempt": claimed.attempt,
            "attempt_no": claimed.attempt_no,
            "worker_id": self.worker_id,
        } | more

    def _log_outcome(
        self, running: RunningAttempt, stat: str, error: dict[str, Any] | None, final: bool = False
    ) -> None:
        """Failures are never silent: a failed attempt at INFO, a task failed for good (its budget
        used, or rejected) at WARNING with the traceback."""
        if stat not in _FAILED_OR_REJECTED or error is None:
            return
        claimed = running.claimed
        budget = running.option["max_unexpected_retries"]  # None: unlimited
        final = self._fails_for_good(running, stat, error, final)
        fields = self._fields(
            running,
            outcome=stat,
            error_type=error["type"],
            error_message=error["message"],
            failures=claimed.fail_cnt + 1,
            max_unexpected_retries=budget,
            final=final,
        )
        if final:
            log.warning(
                "task %s (%s) failed for good on attempt %d: %s: %s\n%s",
                claimed.key,
                claimed.name,
                claimed.attempt_no,
                error["type"],
                error["message"],
                error.get("traceback") or "(no traceback)",
                extra=fields,
            )
        else:
            log.info(
                "task %s (%s) attempt %d failed (%d of %d failures tolerated used): %s: %s",
                claimed.key,
                claimed.name,
                claimed.attempt_no,
                claimed.fail_cnt + 1,
                budget,
                error["type"],
                error["message"],
                extra=fields,
            )

    async def _step_results(self, claimed: ClaimedTask) -> dict[str, Any]:
        """A workflow step's inputs: the results of the steps it needs, read once, now. A need
        that has not succeeded (restarted since this step was unblocked) gives no input: the
        step is put back (``Snooze``, not counted) until the follow-up blocks or reruns it."""
        needs = {n["key"]: n["name"] for n in claimed.needs or ()}
        try:
            read = await self.inputs.read(list(needs))
        except MSchedulerError as exc:  # the store's trouble, not the step's: not counted
            raise Snooze(NEEDS_RECHECK, f"its inputs could not be read: {exc}") from exc
        results: dict[str, Any] = {}
        for key, name in needs.items():
            step = read.get(key)
            if step is None or step.status != _SUCCEEDED:
                status = step.status if step is not None else "gone"
                raise Snooze(NEEDS_RECHECK, f"step {name!r} it needs is {status}, not succeeded")
            results[name] = step.result
        return results

    def _arguments(
        self,
        registered: _Registered,
        claimed: ClaimedTask,
        running: RunningAttempt,
        results: dict[str, Any] | None = None,
    ) -> list[Any]:
        args: list[Any] = []
        if registered.wants_params:
            params = claimed.params
            model = registered.model
            if model is not None and results is not None and "results" in model.model_fields:
                # the params model asks for the needed steps' results: typed, with the params
                if params is not None and not isinstance(params, dict):
                    raise InvalidInput(
                        f"its params model asks for results, but its params are {type(params).__name__}"
                    )
                params = {**(params or {}), "results": results}
            args.append(registered.model.model_validate(params) if registered.model else params)
        if registered.wants_context:
            # checkpoint / progress reports: only handlers that take a context can make them
            running.reports = AttemptReports(
                self._ping_now.set, self.max_checkpoint_bytes, on_progress=self._progress_set.set
            )
            args.append(
                TaskContext(
                    claimed.key,
                    claimed.name,
                    claimed.attempt,
                    claimed.attempt_no,
                    self.worker_id,
                    TaskOption.from_storage(running.option),
                    claimed.checkpoint,
                    running.reports,
                    results or {},
                )
            )
        return args
