"""mscheduler: a durable asyncio task scheduler on MongoDB."""

from mscheduler.clock import FakeClock
from mscheduler.consumer import Consumer, TaskContext
from mscheduler.drivers import Driver, MemoryDriver, MongoDriver
from mscheduler.drivers.base import ListParams
from mscheduler.exceptions import (
    ConsumerStopped,
    InvalidInput,
    LeaseLost,
    MSchedulerError,
    StorageError,
    TaskFailed,
    UnknownTask,
)
from mscheduler.model import (
    AttemptStatus,
    ErrorInfo,
    OptionChange,
    Task,
    TaskInfo,
    TaskOption,
    TaskStatus,
    WorkerState,
)
from mscheduler.operations import Operations, WorkerView
from mscheduler.publisher import Publisher

__all__ = [
    "AttemptStatus",
    "Consumer",
    "ConsumerStopped",
    "Driver",
    "ErrorInfo",
    "FakeClock",
    "InvalidInput",
    "LeaseLost",
    "ListParams",
    "MSchedulerError",
    "MemoryDriver",
    "MongoDriver",
    "Operations",
    "OptionChange",
    "Publisher",
    "StorageError",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskInfo",
    "TaskOption",
    "TaskStatus",
    "UnknownTask",
    "WorkerState",
    "WorkerView",
]

__version__ = "0.1.0"
