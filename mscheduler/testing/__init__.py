"""For tests of apps that use mscheduler, and of mscheduler itself (docs/testing.md): a scheduler
wired on one fake clock (``scheduler_kit``), one handler run with a real context
(``run_handler``), the fake clock, fault injection (``faults``), an in-memory MongoDB for
``MongoDriver`` (``mongomock_database``) and a pytest plugin (``pytest_plugin``).

May import: ``mscheduler.remote`` and everything below it.
"""

from mscheduler.testing.clock import FakeClock, SkewedClock
from mscheduler.testing.handler import HandlerRun, run_handler
from mscheduler.testing.kit import KitPublisher, SchedulerKit, scheduler_kit
from mscheduler.testing.mongomock import mongomock_database

__all__ = [
    "FakeClock",
    "HandlerRun",
    "KitPublisher",
    "SchedulerKit",
    "SkewedClock",
    "mongomock_database",
    "run_handler",
    "scheduler_kit",
]
