"""One root error for the package; storage errors are translated at the driver seam."""

from __future__ import annotations

from typing import Any


class MSchedulerError(Exception):
    """Root of every error raised by mscheduler."""


class InvalidInput(MSchedulerError, ValueError):
    """Bad input (key, name, option, params, filter): nothing was written."""


class UnknownTask(MSchedulerError, LookupError):
    """No task with that key exists."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no task with key {key!r}")
        self.key = key


class TaskFailed(MSchedulerError):
    """The awaited task ended failed (retries used); ``error`` holds the last attempt's error."""

    def __init__(self, key: str, error: dict[str, Any] | None) -> None:
        reason = f"{error.get('type')}: {error.get('message')}" if error else "unknown reason"
        super().__init__(f"task {key!r} failed: {reason}")
        self.key = key
        self.error = error


class LeaseLost(MSchedulerError):
    """This worker no longer holds the attempt (expired, taken over, or revoked)."""


class StorageError(MSchedulerError):
    """The database failed; ``transient`` says whether retrying may help."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ConsumerStopped(MSchedulerError):
    """The consumer stopped because one of its side tasks died."""
