"""For tests of apps that use mscheduler, and of mscheduler itself (docs/testing.md): a scheduler
wired on one fake clock (``scheduler_kit``), one handler run with a real context
(``run_handler``), the fake clock, fault injection (``faults``), an in-memory MongoDB for
``MongoDriver`` that answers as the server does (``mongomock_database``), a stand-in for a sharded
cluster's mongos over it (``mongos_database``) and a pytest plugin (``pytest_plugin``).

May import: ``mscheduler.remote`` and everything below it.
"""

from typing import TYPE_CHECKING, Any

from mscheduler.testing.clock import FakeClock, SkewedClock
from mscheduler.testing.handler import HandlerRun, run_handler
from mscheduler.testing.kit import KitPublisher, SchedulerKit, scheduler_kit
from mscheduler.testing.mongomock import mongomock_database

if TYPE_CHECKING:
    from mscheduler.testing.mongos import MisplacedTask, mongos_database

__all__ = [
    "FakeClock",
    "HandlerRun",
    "KitPublisher",
    "MisplacedTask",
    "SchedulerKit",
    "SkewedClock",
    "mongomock_database",
    "mongos_database",
    "run_handler",
    "scheduler_kit",
]


def __getattr__(name: str) -> Any:
    # the mongos stand-in imports mongomock (the ``testing`` extra): only when asked for
    if name in ("MisplacedTask", "mongos_database"):
        from mscheduler.testing import mongos

        return getattr(mongos, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
