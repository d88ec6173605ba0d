"""One root error for the package; storage errors are translated at the driver seam."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any


class MSchedulerError(Exception):
    """Root of every error raised by mscheduler."""


class InvalidInput(MSchedulerError, ValueError):
    """Bad input (key, name, option, params, filter): nothing was written. ``field``, where
    known: the path of the field at fault (``params.order_id``)."""

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field


class UnknownTask(MSchedulerError, LookupError):
    """No task with that key exists."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no task with key {key!r}")
        self.key = key


class UnknownLimit(MSchedulerError, LookupError):
    """No flow limit with that key exists."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no limit with key {key!r}")
        self.key = key


class UnknownPlan(MSchedulerError, LookupError):
    """No plan with that id exists."""

    def __init__(self, plan_id: str) -> None:
        super().__init__(f"no plan with id {plan_id!r}")
        self.plan_id = plan_id


class TaskFailed(MSchedulerError):
    """The awaited task ended failed (retries used); ``error`` holds the last attempt's error."""

    def __init__(self, key: str, error: dict[str, Any] | None) -> None:
        reason = f"{error.get('type')}: {error.get('message')}" if error else "unknown reason"
        super().__init__(f"task {key!r} failed: {reason}")
        self.key = key
        self.error = error


class TaskExpired(MSchedulerError):
    """The awaited task ended ``expired``: its deadline passed before it started."""

    def __init__(self, key: str) -> None:
        super().__init__(f"task {key!r} expired: its deadline passed before it started")
        self.key = key


class TaskCancelled(MSchedulerError):
    """The awaited task was cancelled by an operator (``reason`` says why)."""

    def __init__(self, key: str, reason: str = "") -> None:
        super().__init__(f"task {key!r} was cancelled" + (f": {reason}" if reason else ""))
        self.key = key
        self.reason = reason


class TransitionRefused(MSchedulerError):
    """An operation on a task that its current status does not allow; nothing was changed."""

    def __init__(self, key: str, operation: str, status: str, rule: str) -> None:
        super().__init__(f"cannot {operation} task {key!r}: it is {status} ({rule})")
        self.key = key
        self.operation = operation
        self.status = status
        self.rule = rule


class KeyTaken(InvalidInput):
    """A key the scheduler makes itself (a child's, a plan run's) is held by a task its maker did
    not make: refused rather than adopted. Nothing was written."""

    def __init__(self, key: str, maker: str) -> None:
        super().__init__(f"key {key!r} is taken by a task that {maker} did not make: refused, not adopted")
        self.key = key
        self.maker = maker


class HandlerSignal(MSchedulerError):
    """A handler raises a subclass to steer its task (not an error of mscheduler's)."""


class Retry(HandlerSignal):
    """Fail this attempt and retry after ``after`` (counted against the budget)."""

    def __init__(self, after: timedelta | float, reason: str = "") -> None:
        self.after = after if isinstance(after, timedelta) else timedelta(seconds=after)
        if self.after < timedelta(0):
            raise InvalidInput("Retry(after=...) must not be negative")
        super().__init__(reason or f"retry in {self.after}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled back from a handler in a process
        return (type(self), (self.after, str(self)))


class Snooze(HandlerSignal):
    """Put the task back for ``after`` without counting a failure (the work is not ready)."""

    def __init__(self, after: timedelta | float, reason: str = "") -> None:
        self.after = after if isinstance(after, timedelta) else timedelta(seconds=after)
        if self.after < timedelta(0):
            raise InvalidInput("Snooze(after=...) must not be negative")
        super().__init__(reason or f"snoozed for {self.after}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.after, str(self)))


class Fail(HandlerSignal):
    """Fail the task for good: no more retries, whatever the budget."""


class LeaseLost(MSchedulerError):
    """This worker no longer holds the attempt (expired, taken over, or revoked)."""


class StorageError(MSchedulerError):
    """The database failed.

    ``transient``: retrying may help (network, failover). ``config``: a configuration error
    (authentication, an unknown or unsatisfiable write concern) that no retry fixes — a consumer
    stops on it, loudly. ``document``: the error is about one task's document (too large,
    unstorable); it is recorded on that task and never stops a consumer. Otherwise the server
    refused the command for another reason: consumers log it and back off.
    """

    def __init__(
        self, message: str, *, transient: bool = False, config: bool = False, document: bool = False
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.config = config
        self.document = document


class ConsumerStopped(MSchedulerError):
    """The consumer stopped because one of its side tasks died."""


def error_reason(error: Mapping[str, Any]) -> str:
    """A pydantic error's reason (one of ``ValidationError.errors()``), without the refused
    value: what an answer of the API says never echoes its input."""
    if error.get("type") == "union_tag_invalid":  # pydantic's message quotes the tag it got
        ctx = error.get("ctx") or {}
        return f"unknown {ctx.get('discriminator', 'kind')}: expected one of {ctx.get('expected_tags', '')}"
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")
