"""Issue 18 A (bounded cost on a busy replica set): the queries the driver sends, checked on
mongomock for their shape (what makes a server's planner use an index, and what a server writes),
since mongomock ignores index semantics. Their plans on a real server: tests/real/test_query_plans.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import UpdateOne

from mscheduler import FakeClock, Publisher, Task
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.test_mongo_reads_and_sessions import _Session, _SessionCollection

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
UNIQUE_LIVE_FILTER_TYPE = {"$type": "string"}


class Recording(_SessionCollection):
    """Records the filters of the commands it passes on (mongomock ignores sessions)."""

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if not callable(call):
            return call

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.__dict__.setdefault("sent", []).append((name, args, kwargs))
            return call(*args, **kwargs)

        return recorded

    def find(self, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.setdefault("sent", []).append(("find", args, kwargs))
        kwargs.pop("session", None)
        return self._inner.find(*args, **kwargs)


def unique_live_conditions(value: Any) -> list[Any]:
    """Every condition on ``state.unique_live`` anywhere in a filter."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "state.unique_live":
                found.append(v)
            else:
                found.extend(unique_live_conditions(v))
    elif isinstance(value, list):
        for v in value:
            found.extend(unique_live_conditions(v))
    return found


async def test_the_transactional_upsert_states_the_type_of_the_partial_unique_index() -> None:
    """Item 1: ``{state.unique_live: h}`` cannot use the ``$type``-partial index (the planner
    cannot prove an equality on a string is a string), so each unique task of a send inside a
    transaction scanned the collection. Every unique_live condition the driver sends says
    ``$type: "string"``."""
    driver = MongoDriver(mongomock_database())
    await driver.setup()
    recording = Recording(driver.tasks)
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = recording
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await publisher.send(Task("a", "job", {"n": 1}, unique_by="params"), session=_Session())
    await publisher.send(Task("b", "job", {"n": 1}, unique_by="params"), session=_Session())
    ops = [op for name, args, _ in recording.sent if name == "bulk_write" for op in args[0]]
    assert ops and all(isinstance(op, UpdateOne) for op in ops)
    conditions = [c for op in ops for c in unique_live_conditions(op._filter)]
    assert len(conditions) == 2
    assert all(isinstance(c, dict) and c.get("$type") == "string" for c in conditions), conditions
    assert await driver.get_task("b") is None, "b's params are a's: not created"
    assert await driver._unique_holder_of("a") == "a"
    reads = [args[0] for name, args, _ in recording.sent if name in ("find", "find_one")]
    conditions = [c for f in reads for c in unique_live_conditions(f)]
    assert conditions and all(isinstance(c, dict) and c.get("$type") == "string" for c in conditions)
