"""Run one handler once with a real ``TaskContext``, no consumer and no store::

    run = await run_handler(send_invoice, {"order_id": 42, "email": "ada@example.com"})
    assert run.outcome == "succeeded" and run.result == {...}
    assert run.progress == [(0.5, "half way")] and run.checkpoints == [{"done": 10}]

    run = await run_handler(charge_card, {...}, attempt_no=1)
    assert isinstance(run.verdict, Retry) and run.verdict.after == timedelta(seconds=2)

The handler is called exactly as a consumer calls it: its params validated into its pydantic
model (``outcome == "rejected"`` when they do not fit), an ``async def`` on the loop, a plain
function in a thread (with a ``SyncTaskContext``), ``run_in="process"`` in a process; its
``ctx.checkpoint`` and ``ctx.progress`` checked by the consumer's own rules (an unstorable or
oversized checkpoint raises ``InvalidInput`` in the handler) and recorded in order; its result
checked as the consumer checks it (``ResultTooLarge`` / ``ResultNotStorable``: "rejected").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from mscheduler.domain.exceptions import Fail, HandlerSignal, Retry, Snooze
from mscheduler.domain.model import TaskOption
from mscheduler.domain.outcomes import DEFAULT_MAX_RESULT_BYTES
from mscheduler.domain.outcomes import succeeded as succeeded_outcome
from mscheduler.runtime.consumer.handlers import HandlerPools, RunIn, inspect_handler
from mscheduler.runtime.consumer.reports import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    AttemptReports,
    checked_checkpoint,
    checked_progress,
)
from mscheduler.runtime.consumer.runner import TaskContext


@dataclass(slots=True)
class HandlerRun:
    """What one call of a handler did.

    ``outcome``: ``succeeded`` (``result``), ``retry`` / ``snoozed`` / ``failed`` (``verdict``:
    the ``Retry``, ``Snooze`` or ``Fail`` it raised; a plain exception is ``failed`` with
    ``error``), or ``rejected`` (params that do not fit its model, or a result that cannot be
    stored: ``error`` says why). ``progress`` and ``checkpoints``: what it reported, in order.
    """

    outcome: str
    result: Any = None
    verdict: HandlerSignal | None = None
    error: BaseException | None = None
    rejected: str | None = None
    progress: list[tuple[float, str | None]] = field(default_factory=list)
    checkpoints: list[Any] = field(default_factory=list)


class _Recorded(AttemptReports):
    """Reports that land at once, in a list, after the consumer's checks."""

    def __init__(self, max_checkpoint_bytes: int, run: HandlerRun) -> None:
        super().__init__(lambda: None, max_checkpoint_bytes)
        self.run = run

    async def save_checkpoint(self, data: Any) -> None:
        self.run.checkpoints.append(checked_checkpoint(data, self.max_checkpoint_bytes))

    def set_progress(self, fraction: Any, message: Any = None) -> None:
        progress = checked_progress(fraction, message)
        self.run.progress.append((progress["fraction"], progress["message"]))


async def run_handler(
    handler: Callable[..., Any],
    params: Any = None,
    *,
    key: str = "test-task",
    name: str = "test",
    attempt_no: int = 1,
    checkpoint: Any = None,
    option: TaskOption | None = None,
    worker_id: str = "test-worker",
    run_in: RunIn | None = None,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
) -> HandlerRun:
    """Call ``handler`` once as attempt ``attempt_no`` of task ``key`` (``checkpoint``: what an
    earlier attempt saved, as ``ctx.checkpoint_data``); what it did (see ``HandlerRun``)."""
    pools = HandlerPools(1, 1, worker_id)
    registered = inspect_handler(name, handler, run_in, pools)
    run = HandlerRun("succeeded")
    args: list[Any] = []
    try:
        if registered.wants_params:
            try:
                args.append(registered.model.model_validate(params) if registered.model else params)
            except ValidationError as exc:
                return HandlerRun("rejected", error=exc, rejected=f"InvalidParams: {exc}")
        if registered.wants_context:
            reports = _Recorded(max_checkpoint_bytes, run)
            attempt = f"{key}-attempt-{attempt_no}"
            option = option or TaskOption()
            args.append(TaskContext(key, name, attempt, attempt_no, worker_id, option, checkpoint, reports))
        try:
            result = await registered.fn(*args)
        except (Retry, Snooze, Fail) as exc:
            run.outcome, run.verdict, run.error = _kind(exc), exc, exc
            return run
        except Exception as exc:
            run.outcome, run.error = "failed", exc
            return run
        done = succeeded_outcome(result, max_result_bytes)
        if done.status != "succeeded":
            error = done.error or {}
            run.outcome, run.rejected = "rejected", f"{error.get('type')}: {error.get('message')}"
            return run
        run.result = result
        return run
    finally:
        pools.close()


def _kind(exc: HandlerSignal) -> str:
    """A subclass of Retry, Snooze or Fail counts as its base."""
    if isinstance(exc, Retry):
        return "retry"
    return "snoozed" if isinstance(exc, Snooze) else "failed"
