"""For tests of apps that use mscheduler, and of mscheduler itself: the fake clock, fault
injection (``faults``) and an in-memory MongoDB for ``MongoDriver`` (``mongomock_database``).

May import: anything below the surfaces (runtime, services, drivers, domain).
"""

from mscheduler.testing.clock import FakeClock, SkewedClock
from mscheduler.testing.mongomock import mongomock_database

__all__ = ["FakeClock", "SkewedClock", "mongomock_database"]
