"""Transactional publish (SPEC F20): needs a real replica set; skipped otherwise, and said so."""

from __future__ import annotations

import uuid

import pytest

from mscheduler import MongoDriver, Publisher, Task
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
]


async def test_send_joins_the_callers_transaction() -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(REAL_URI)
    database = client[f"mscheduler_tx_{uuid.uuid4().hex[:8]}"]
    try:
        driver = MongoDriver(database)
        await driver.setup()
        publisher = Publisher(driver)
        orders = database["orders"]
        await orders.insert_one({"_id": "seed"})  # collections must exist before a transaction

        async with client.start_session() as session:
            async with await session.start_transaction():
                await orders.insert_one({"_id": "o1"}, session=session)
                assert await publisher.send(Task("invoice-o1", "invoice"), session=session)
                await session.abort_transaction()
        assert await driver.get_task("invoice-o1") is None
        assert await orders.find_one({"_id": "o1"}) is None

        async with client.start_session() as session:
            async with await session.start_transaction():
                await orders.insert_one({"_id": "o2"}, session=session)
                assert await publisher.send(Task("invoice-o2", "invoice"), session=session)
        assert (await driver.get_task("invoice-o2")) is not None
        assert await orders.find_one({"_id": "o2"}) is not None
    finally:
        await client.drop_database(database.name)
        await client.close()
