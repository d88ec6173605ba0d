"""Storage drivers: the seam between the scheduler and its store."""

from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory import MemoryDriver
from mscheduler.drivers.mongo import MongoDriver

__all__ = ["Driver", "MemoryDriver", "MongoDriver"]
