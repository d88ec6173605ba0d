"""mscheduler: a durable asyncio task scheduler on MongoDB."""

from mscheduler.clock import FakeClock
from mscheduler.consumer import Consumer, TaskContext
from mscheduler.drivers import MemoryDriver, MongoDriver
from mscheduler.exceptions import InvalidInput, MSchedulerError, TaskFailed, UnknownTask
from mscheduler.model import OptionChange, Task, TaskInfo, TaskOption, TaskStatus
from mscheduler.publisher import Publisher

__all__ = [
    "Consumer",
    "FakeClock",
    "InvalidInput",
    "MSchedulerError",
    "MemoryDriver",
    "MongoDriver",
    "OptionChange",
    "Publisher",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskInfo",
    "TaskOption",
    "TaskStatus",
    "UnknownTask",
]

__version__ = "0.1.0"
