"""The third real-server audit's findings in the Mongo driver (issue 24 A), each shown on
mongomock or on a fake of the collection that answers as the server does where mongomock cannot
(write-concern errors, a stepped-down primary, a mongos). What only a server can show is in
tests/real/test_audit_3.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler import Operations, Task
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


async def index_names(database: Any) -> set[str]:
    return {ix["name"] async for ix in database["mscheduler_tasks"].list_indexes()}


# -- M1: a request path checks the store, it never builds, drops or rebuilds an index --------------


async def test_operations_send_checks_the_store_and_changes_no_index() -> None:
    database = mongomock_database()
    await MongoDriver(database).setup()
    # an index an earlier build left (``setup`` drops it; a request must not: during a rolling
    # upgrade the old servers' queries may still name it)
    await database["mscheduler_tasks"].create_index([("state.status", 1)], name="claim")
    before = await index_names(database)
    ops = Operations(MongoDriver(database, create_indexes=False))
    assert await ops.send(Task("t", "job"))
    assert await index_names(database) == before

    fresh = mongomock_database("never_set_up")
    with pytest.raises(StorageError) as refused:
        await Operations(MongoDriver(fresh, create_indexes=False)).send(Task("t", "job"))
    assert refused.value.config and "mscheduler setup" in str(refused.value)
    assert await fresh.list_collection_names() == [], "no layout recorded, no index built"
