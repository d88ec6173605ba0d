"""mscheduler: a durable asyncio task scheduler on MongoDB."""

import importlib
from typing import TYPE_CHECKING

from mscheduler.domain.version import __version__ as __version__

__all__ = [
    "ApiError",
    "ApiRefused",
    "ApiUnreachable",
    "App",
    "AtSchedule",
    "AttemptStatus",
    "CatchUp",
    "Child",
    "Consumer",
    "ConsumerStopped",
    "CronSchedule",
    "Driver",
    "ErrorInfo",
    "Event",
    "EventKind",
    "Events",
    "EverySchedule",
    "ExecutorClient",
    "ExpiryService",
    "ExponentialRetry",
    "Fail",
    "Fairness",
    "FakeClock",
    "FixedRetry",
    "FixedThenExponentialRetry",
    "HandlerSignal",
    "InvalidInput",
    "Jitter",
    "KeyTaken",
    "LeaseLost",
    "LimitInfo",
    "ListParams",
    "MSchedulerError",
    "MemoryDriver",
    "MongoDriver",
    "MonthlySchedule",
    "NotAnApi",
    "Operations",
    "OptionChange",
    "PerDayRetry",
    "Plan",
    "PlanInfo",
    "PlanState",
    "PlanTiming",
    "Planner",
    "Publisher",
    "Rate",
    "RemoteExecutors",
    "RemoteOperations",
    "RemoteTask",
    "Retention",
    "RetentionService",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "Snooze",
    "StepInfo",
    "StorageError",
    "SyncPublisher",
    "SyncTaskContext",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "TaskExpired",
    "TaskFailed",
    "TaskInfo",
    "TaskOption",
    "TaskStatus",
    "TransitionRefused",
    "UnknownLimit",
    "UnknownPlan",
    "UnknownTask",
    "WeeklySchedule",
    "WorkerState",
    "WorkerView",
    "WorkflowInfo",
]


if TYPE_CHECKING:
    from mscheduler.domain.exceptions import (
        ConsumerStopped,
        Fail,
        HandlerSignal,
        InvalidInput,
        KeyTaken,
        LeaseLost,
        MSchedulerError,
        Retry,
        Snooze,
        StorageError,
        TaskCancelled,
        TaskExpired,
        TaskFailed,
        TransitionRefused,
        UnknownLimit,
        UnknownPlan,
        UnknownTask,
    )
    from mscheduler.domain.fairness import Fairness
    from mscheduler.domain.limits import LimitInfo, Rate
    from mscheduler.domain.listing import ListParams
    from mscheduler.domain.model import (
        AttemptStatus,
        Child,
        ErrorInfo,
        OptionChange,
        StepInfo,
        Task,
        TaskInfo,
        TaskOption,
        TaskStatus,
        WorkerState,
        WorkflowInfo,
    )
    from mscheduler.domain.plans import Plan, PlanInfo, PlanState
    from mscheduler.domain.retry import (
        ExponentialRetry,
        FixedRetry,
        FixedThenExponentialRetry,
        Jitter,
        PerDayRetry,
        RetryPolicy,
    )
    from mscheduler.domain.schedule import (
        AtSchedule,
        CatchUp,
        CronSchedule,
        EverySchedule,
        MonthlySchedule,
        PlanTiming,
        Schedule,
        WeeklySchedule,
    )
    from mscheduler.drivers import Driver, MemoryDriver, MongoDriver
    from mscheduler.operations import Operations, WorkerView
    from mscheduler.remote.client import (
        ApiError,
        ApiRefused,
        ApiUnreachable,
        ExecutorClient,
        NotAnApi,
        RemoteOperations,
        RemoteTask,
    )
    from mscheduler.remote.executors import RemoteExecutors
    from mscheduler.runtime.app import App
    from mscheduler.runtime.consumer import Consumer, SyncTaskContext, TaskContext
    from mscheduler.runtime.publisher import Publisher
    from mscheduler.runtime.sync_publisher import SyncPublisher
    from mscheduler.services.events import Event, EventKind, Events
    from mscheduler.services.expiry import ExpiryService
    from mscheduler.services.planner import Planner
    from mscheduler.services.retention import Retention, RetentionService
    from mscheduler.testing.clock import FakeClock

# Every public name is imported when first asked for (``from mscheduler import Task``): ``import
# mscheduler`` alone, as the command line's ``--version`` and ``--help`` do, loads none of
# PyMongo, pydantic or httpx.
_LAZY = {
    **dict.fromkeys(
        (
            "ConsumerStopped",
            "Fail",
            "HandlerSignal",
            "InvalidInput",
            "KeyTaken",
            "LeaseLost",
            "MSchedulerError",
            "Retry",
            "Snooze",
            "StorageError",
            "TaskCancelled",
            "TaskExpired",
            "TaskFailed",
            "TransitionRefused",
            "UnknownLimit",
            "UnknownPlan",
            "UnknownTask",
        ),
        "mscheduler.domain.exceptions",
    ),
    **dict.fromkeys(("Fairness",), "mscheduler.domain.fairness"),
    **dict.fromkeys(("LimitInfo", "Rate"), "mscheduler.domain.limits"),
    **dict.fromkeys(("ListParams",), "mscheduler.domain.listing"),
    **dict.fromkeys(
        (
            "AttemptStatus",
            "Child",
            "ErrorInfo",
            "OptionChange",
            "StepInfo",
            "Task",
            "TaskInfo",
            "TaskOption",
            "TaskStatus",
            "WorkerState",
            "WorkflowInfo",
        ),
        "mscheduler.domain.model",
    ),
    **dict.fromkeys(("Plan", "PlanInfo", "PlanState"), "mscheduler.domain.plans"),
    **dict.fromkeys(
        (
            "ExponentialRetry",
            "FixedRetry",
            "FixedThenExponentialRetry",
            "Jitter",
            "PerDayRetry",
            "RetryPolicy",
        ),
        "mscheduler.domain.retry",
    ),
    **dict.fromkeys(
        (
            "AtSchedule",
            "CatchUp",
            "CronSchedule",
            "EverySchedule",
            "MonthlySchedule",
            "PlanTiming",
            "Schedule",
            "WeeklySchedule",
        ),
        "mscheduler.domain.schedule",
    ),
    **dict.fromkeys(("Driver", "MemoryDriver", "MongoDriver"), "mscheduler.drivers"),
    **dict.fromkeys(("Operations", "WorkerView"), "mscheduler.operations"),
    **dict.fromkeys(("RemoteExecutors",), "mscheduler.remote.executors"),
    **dict.fromkeys(("App",), "mscheduler.runtime.app"),
    **dict.fromkeys(("Consumer", "SyncTaskContext", "TaskContext"), "mscheduler.runtime.consumer"),
    **dict.fromkeys(("Publisher",), "mscheduler.runtime.publisher"),
    **dict.fromkeys(("SyncPublisher",), "mscheduler.runtime.sync_publisher"),
    **dict.fromkeys(("Event", "EventKind", "Events"), "mscheduler.services.events"),
    **dict.fromkeys(("ExpiryService",), "mscheduler.services.expiry"),
    **dict.fromkeys(("Planner",), "mscheduler.services.planner"),
    **dict.fromkeys(("Retention", "RetentionService"), "mscheduler.services.retention"),
    **dict.fromkeys(("FakeClock",), "mscheduler.testing.clock"),
    **dict.fromkeys(
        (
            "ApiError",
            "ApiRefused",
            "ApiUnreachable",
            "ExecutorClient",
            "NotAnApi",
            "RemoteOperations",
            "RemoteTask",
        ),
        "mscheduler.remote.client",
    ),
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mscheduler' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
