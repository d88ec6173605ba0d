"""mscheduler: a durable asyncio task scheduler on MongoDB."""

from mscheduler.clock import FakeClock
from mscheduler.consumer import Consumer, TaskContext
from mscheduler.drivers import Driver, MemoryDriver, MongoDriver
from mscheduler.drivers.base import ListParams
from mscheduler.events import Event, EventKind, Events
from mscheduler.exceptions import (
    ConsumerStopped,
    Fail,
    HandlerSignal,
    InvalidInput,
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
from mscheduler.limits import LimitInfo, Rate
from mscheduler.model import (
    AttemptStatus,
    Child,
    ErrorInfo,
    OptionChange,
    Task,
    TaskInfo,
    TaskOption,
    TaskStatus,
    WorkerState,
)
from mscheduler.operations import Operations, WorkerView
from mscheduler.planner import Planner
from mscheduler.plans import Plan, PlanInfo, PlanState
from mscheduler.publisher import Publisher
from mscheduler.schedule import CatchUp, PlanTiming

__all__ = [
    "AttemptStatus",
    "CatchUp",
    "Child",
    "Consumer",
    "ConsumerStopped",
    "Driver",
    "ErrorInfo",
    "Event",
    "EventKind",
    "Events",
    "Fail",
    "FakeClock",
    "HandlerSignal",
    "InvalidInput",
    "LeaseLost",
    "LimitInfo",
    "ListParams",
    "MSchedulerError",
    "MemoryDriver",
    "MongoDriver",
    "Operations",
    "OptionChange",
    "Plan",
    "PlanInfo",
    "PlanState",
    "PlanTiming",
    "Planner",
    "Publisher",
    "Rate",
    "Retry",
    "Snooze",
    "StorageError",
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
    "WorkerState",
    "WorkerView",
]

__version__ = "0.1.0"
