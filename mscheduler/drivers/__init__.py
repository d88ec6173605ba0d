"""Storage drivers: the seam between the scheduler and its store — ``base.py`` (the protocol and
its params objects), ``memory/`` and ``mongo/`` (the only place with queries, indexes, streams).

May import: ``mscheduler.domain``.
"""

from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory import MemoryDriver
from mscheduler.drivers.mongo import MongoDriver

__all__ = ["Driver", "MemoryDriver", "MongoDriver"]
