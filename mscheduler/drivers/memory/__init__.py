"""The in-memory driver: the store's semantics in one process (demo, tests, ``mscheduler dev``),
one module per concern beside ``driver.py``.

May import: ``mscheduler.drivers.base`` and ``mscheduler.domain``.
"""

from mscheduler.drivers.memory.driver import MemoryDriver

__all__ = ["MemoryDriver"]
