"""mscheduler: a durable asyncio task scheduler on MongoDB."""

import importlib
import sys
import types
import warnings
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
    from importlib.machinery import ModuleSpec

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

# Every public name is imported when first asked for (``from mscheduler import Task`` works as
# ever): ``import mscheduler`` alone, as the command line's ``--version`` and ``--help`` do, loads
# none of PyMongo, pydantic or httpx.
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


# -- modules that moved when the package was split into layers (2026-11) ------------------------
# Old import paths keep working: ``import mscheduler.schedule`` gives ``mscheduler.domain.schedule``
# (the same module object) with a DeprecationWarning naming the new path. Prefer
# ``from mscheduler import ...``: every type a user constructs is there.
_MOVED = {
    f"mscheduler.{old}": f"mscheduler.{new}"
    for old, new in (
        ("clock", "domain.clock"),
        ("exceptions", "domain.exceptions"),
        ("family", "domain.family"),
        ("limits", "domain.limits"),
        ("listing", "domain.listing"),
        ("model", "domain.model"),
        ("outcomes", "domain.outcomes"),
        ("plans", "domain.plans"),
        ("retry", "domain.retry"),
        ("schedule", "domain.schedule"),
        ("state", "domain.state"),
        ("stats", "domain.stats"),
        ("unique", "domain.unique"),
        ("drivers.events_common", "domain.events"),
        ("consumer", "runtime.consumer"),
        ("consumer.claimer", "runtime.consumer.claimer"),
        ("consumer.consumer", "runtime.consumer.consumer"),
        ("consumer.discovery", "runtime.consumer.discovery"),
        ("consumer.finisher", "runtime.consumer.finisher"),
        ("consumer.limiter", "runtime.consumer.limiter"),
        ("consumer.pinger", "runtime.consumer.pinger"),
        ("consumer.reports", "runtime.consumer.reports"),
        ("consumer.runner", "runtime.consumer.runner"),
        ("publisher", "runtime.publisher"),
        ("executor_client", "remote.client"),
        ("service", "services.base"),
        ("planner", "services.planner"),
        ("expiry", "services.expiry"),
        ("retention", "services.retention"),
        ("children", "services.children"),
        ("events", "services.events"),
        ("logs", "observability.logs"),
        ("metrics", "observability.metrics"),
        ("tracing", "observability.tracing"),
        ("faults", "testing.faults"),
        ("drivers.memory_children", "drivers.memory.children"),
        ("drivers.memory_events", "drivers.memory.events"),
        ("drivers.memory_limits", "drivers.memory.limits"),
        ("drivers.memory_listing", "drivers.memory.listing"),
        ("drivers.memory_maintenance", "drivers.memory.maintenance"),
        ("drivers.memory_plans", "drivers.memory.plans"),
        ("drivers.memory_stats", "drivers.memory.stats"),
        ("drivers.mongo_children", "drivers.mongo.children"),
        ("drivers.mongo_common", "drivers.mongo.common"),
        ("drivers.mongo_events", "drivers.mongo.events"),
        ("drivers.mongo_limits", "drivers.mongo.limits"),
        ("drivers.mongo_maintenance", "drivers.mongo.maintenance"),
        ("drivers.mongo_ping", "drivers.mongo.ping"),
        ("drivers.mongo_plans", "drivers.mongo.plans"),
        ("drivers.mongo_queries", "drivers.mongo.queries"),
        ("drivers.mongo_stats", "drivers.mongo.stats"),
        ("drivers.mongo_workers", "drivers.mongo.workers"),
    )
}


class _MovedModules:
    """Finds an old module path and hands out the module at its new one (see ``_MOVED``): a
    meta path finder and loader (``importlib.abc``'s protocols, without importing them)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> "ModuleSpec | None":
        if fullname not in _MOVED:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec: "ModuleSpec") -> types.ModuleType:
        return types.ModuleType(spec.name)  # a stand-in: exec_module puts the real one in its place

    def exec_module(self, module: types.ModuleType) -> None:
        new = _MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new}; import from there, or from mscheduler",
            DeprecationWarning,
            stacklevel=2,
        )
        sys.modules[module.__name__] = importlib.import_module(new)


sys.meta_path.insert(0, _MovedModules())
