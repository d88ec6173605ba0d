"""The outcome rules of an attempt, shared by every kind of worker (Python consumers and remote
executors over HTTP): what a success, a failure, a ``Retry``, a ``Fail`` or a ``Snooze`` writes,
when a failed task may run again (its retry policy), when a failure ends the task, and which
results can be stored. No rule is written twice: ``Consumer`` and ``RemoteExecutors`` both build
their ``FinishParams`` from an ``Outcome`` made here.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from random import Random
from typing import Any

from pydantic import BaseModel

from mscheduler.domain.model import AttemptStatus, TaskOption, check_params, encoded_size

TRACEBACK_LIMIT = 8000
ERROR_MESSAGE_LIMIT = 2000
DEFAULT_MAX_RESULT_BYTES = 512 * 1024

_SUCCEEDED = AttemptStatus.SUCCEEDED.value
_FAILED = AttemptStatus.FAILED.value
_REJECTED = AttemptStatus.REJECTED.value
_SNOOZED = AttemptStatus.SNOOZED.value


@dataclass(slots=True, frozen=True)
class Outcome:
    """What an attempt's finish writes (``FinishParams`` without the who and when)."""

    status: str  # an AttemptStatus value other than running / lost
    result: Any = None
    error: dict[str, Any] | None = None
    retry_at: datetime | None = None
    final: bool = False  # a failure that ends the task whatever the budget (Fail)


def error_info(exc: BaseException) -> dict[str, Any]:
    """An exception as stored on the attempt: type, message, traceback (both cut to a size)."""
    tb = "".join(traceback.format_exception(exc))
    return error_dict(type(exc).__name__, str(exc), tb)


def error_dict(kind: str, message: str, tb: str | None = None) -> dict[str, Any]:
    """An attempt's ``error``; the message and the traceback are cut to their limits (the end
    of a traceback is kept: that is where it failed)."""
    if tb is not None and len(tb) > TRACEBACK_LIMIT:
        tb = "...\n" + tb[-TRACEBACK_LIMIT:]
    return {"type": kind, "message": message[:ERROR_MESSAGE_LIMIT], "traceback": tb}


def storable_result(result: Any, max_result_bytes: int) -> tuple[Any, dict[str, Any] | None]:
    """The result as stored, or (None, the reason it cannot be): a pydantic model is dumped
    to JSON-like data; values MongoDB cannot hold, or a result over ``max_result_bytes``,
    fail the task for good (no retry: the same handler gives the same result)."""
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    try:
        result = check_params(result, path="result")
    except ValueError as exc:
        return None, error_dict("ResultNotStorable", f"the handler's result cannot be stored: {exc}")
    size = 0 if result is None else encoded_size(result)
    if size > max_result_bytes:
        return None, error_dict(
            "ResultTooLarge",
            f"the handler's result is {size} bytes, more than max_result_bytes ({max_result_bytes})",
        )
    return result, None


def succeeded(result: Any, max_result_bytes: int) -> Outcome:
    """A handler returned ``result``: succeeded, or rejected when the result cannot be stored."""
    if result is None:  # most handlers return nothing: always storable (an Outcome is immutable)
        return _SUCCEEDED_EMPTY
    stored, error = storable_result(result, max_result_bytes)
    if error is not None:
        return Outcome(_REJECTED, error=error)
    return Outcome(_SUCCEEDED, result=stored)


_SUCCEEDED_EMPTY = Outcome(_SUCCEEDED)


def rejected(error: dict[str, Any]) -> Outcome:
    """The task cannot run as given (invalid params): failed for good, no retries."""
    return Outcome(_REJECTED, error=error)


def retry_time(
    option: Mapping[str, Any], failure_times: Sequence[datetime], now: datetime, rng: Random
) -> datetime:
    """When a failed attempt's task may run again, by its retry policy (mscheduler.domain.retry), given
    the failures counted before this one. A policy whose budget is used says None: the derived
    state fails the task then anyway (``now`` is written)."""
    policy = TaskOption.from_storage(dict(option)).retry_policy
    when = policy.next_retry([*failure_times, now], now, rng)
    return when if when is not None else now


def failed(
    error: dict[str, Any],
    option: Mapping[str, Any],
    failure_times: Sequence[datetime],
    now: datetime,
    rng: Random,
) -> Outcome:
    """A plain failure: retried when the task's retry policy says, while its budget lasts."""
    return Outcome(_FAILED, error=error, retry_at=retry_time(option, failure_times, now, rng))


def retry_after(error: dict[str, Any], after: timedelta, now: datetime) -> Outcome:
    """The handler asked to be retried after ``after`` (``Retry``): a failure, counted. The
    error is stored as given (a Python handler's ``Retry``, or what an executor reported)."""
    return Outcome(_FAILED, error=error, retry_at=now + after)


def fail_for_good(error: dict[str, Any]) -> Outcome:
    """The handler said the task cannot succeed (``Fail``): no more retries (``final``). The
    error is stored as given: its type is what was raised or reported, not a replacement."""
    return Outcome(_FAILED, error=error, final=True)


def snoozed(message: str, after: timedelta, now: datetime) -> Outcome:
    """The work is not ready (``Snooze``): back after ``after``, not counted as a failure."""
    return Outcome(_SNOOZED, error=error_dict("Snooze", message), retry_at=now + after)


def fails_for_good(
    option: Mapping[str, Any],
    fail_cnt: int,
    status: str,
    error: Mapping[str, Any] | None,
    final: bool = False,
) -> bool:
    """Does this outcome end the task as failed (rejected, ``final`` — Fail —, or the budget
    used)? ``fail_cnt``: the failures counted before this attempt."""
    if status not in (_FAILED, _REJECTED) or error is None:
        return False
    budget = option["max_unexpected_retries"]  # None: unlimited
    return status == _REJECTED or final or (budget is not None and fail_cnt + 1 > budget)
