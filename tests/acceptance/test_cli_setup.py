"""``mscheduler setup`` builds a store's indexes; workers check them and never build them (issue
18.8: ``createIndexes`` in a consumer's start waited for the commit quorum)."""

from __future__ import annotations

import pytest

from mscheduler import Consumer, MongoDriver, Publisher, Task
from mscheduler.cli.setup import setup_store
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.mongo.indexes import existing_indexes
from mscheduler.testing.mongomock import mongomock_database


async def test_a_consumer_or_publisher_on_a_store_not_set_up_refuses_naming_what_is_missing() -> None:
    database = mongomock_database()
    driver = MongoDriver(database, create_indexes=False)  # as on a server
    consumer = Consumer(driver, worker_id="w1")

    @consumer.handler("job")
    async def job(params: object) -> None:
        return None

    with pytest.raises(StorageError) as refused:
        await consumer.start()
    assert refused.value.config
    assert "claimers_claim" in str(refused.value) and "mscheduler setup" in str(refused.value)
    with pytest.raises(StorageError):
        await Publisher(driver).send(Task("t", "job"))
    assert await database["mscheduler_tasks"].count_documents({}) == 0, "nothing was written"
    assert set(await existing_indexes(database["mscheduler_tasks"])) <= {"_id_"}, "nor built"

    made, notes = await setup_store(database)
    assert notes == []
    assert dict(made)["mscheduler_tasks"].count(",") >= 10
    assert await Publisher(driver).send(Task("t", "job"))
    await consumer.start()
    await consumer.stop()
    again, notes = await setup_store(database)
    assert again == made and notes == [], "idempotent"
