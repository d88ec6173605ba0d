"""MongoDriver: read-backs from the primary (A8), the send inside a caller's transaction (A4),
resets in one bulk write (A9). Real-server runs of the same: tests/real/."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from mscheduler import FakeClock, Publisher, Task
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.test_mongo_retries import FlakyCollection

NOW = datetime(2030, 1, 1, tzinfo=UTC)


async def test_scheduler_read_backs_go_to_the_primary_at_local_read_concern_for_the_claim_recovery() -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[Any] = AsyncMongoClient(
        "mongodb://127.0.0.1:1/?readPreference=secondaryPreferred", connect=False
    )
    try:
        driver = MongoDriver(client["mscheduler"])
        assert driver.tasks.read_preference == ReadPreference.SECONDARY_PREFERRED  # the user's choice
        assert driver.tasks_primary.read_preference == ReadPreference.PRIMARY
        assert driver.tasks_recovery.read_preference == ReadPreference.PRIMARY
        assert driver.tasks_recovery.read_concern.level == "local"  # a timed-out majority claim is there
        assert driver.tasks_recovery.write_concern.document == {"w": "majority", "wtimeout": 10_000}
        assert driver.limits_primary.read_preference == ReadPreference.PRIMARY  # held_slots, recovery
    finally:
        await client.close()


class _Session:
    """Stands in for a ClientSession on mongomock (which has none): the driver passes it on."""


class _SessionCollection(FlakyCollection):
    """mongomock refuses any session: record it and pass the call on without it."""

    sessions: list[Any]

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if not callable(call):
            return call

        def without_session(*args: Any, **kwargs: Any) -> Any:
            if "session" in kwargs:
                self.__dict__.setdefault("sessions", []).append(kwargs.pop("session"))
            return call(*args, **kwargs)

        return without_session


async def _driver_with_flaky() -> tuple[MongoDriver, FlakyCollection]:
    driver = MongoDriver(mongomock_database(), create_indexes=True, backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    flaky = _SessionCollection(driver.tasks)
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = flaky
    return driver, flaky


async def test_in_a_transaction_an_existing_key_is_an_upsert_not_a_duplicate_key_error() -> None:
    """A duplicate key error would abort the caller's transaction: an upsert leaves the task."""
    driver, flaky = await _driver_with_flaky()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    assert await publisher.send(Task("t", "job", {"v": 1}))
    session = _Session()
    assert await publisher.send(Task("t", "job", {"v": 2}), session=session) is False
    assert await publisher.send(Task("u", "job", {"v": 3}), session=session) is True
    assert flaky.calls["insert_many"] == 1, "inside a transaction: no insert, an upsert"
    assert flaky.calls["bulk_write"] == 2
    assert flaky.sessions == [session, session], "both writes ran in the caller's session"
    assert (await driver.get_task("t"))["params"] == {"v": 1}  # type: ignore[index]
    assert (await driver.get_task("u"))["params"] == {"v": 3}  # type: ignore[index]


async def test_in_a_transaction_errors_keep_their_labels_and_are_not_retried() -> None:
    driver, flaky = await _driver_with_flaky()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await driver.setup()
    conflict = OperationFailure(
        "WriteConflict", code=112, details={"errorLabels": ["TransientTransactionError"]}
    )
    flaky.fail("bulk_write", conflict)
    with pytest.raises(OperationFailure) as caught:
        await publisher.send(Task("t", "job"), session=_Session())
    assert caught.value is conflict and caught.value.has_error_label("TransientTransactionError")
    assert flaky.calls["bulk_write"] == 1, "with_transaction retries the whole transaction, not us"
    # outside a transaction the same error is ours to retry
    flaky.fail("insert_many", OperationFailure("WriteConflict", code=112))
    assert await publisher.send(Task("t", "job")) is True
    assert flaky.calls["insert_many"] == 2


async def test_reset_finished_is_one_bulk_write_whatever_the_batch() -> None:
    driver, flaky = await _driver_with_flaky()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    keys = [f"t{i}" for i in range(50)]
    await publisher.send_many([Task(k, "job") for k in keys])
    # finish half of them by hand, as a consumer would have (status succeeded)
    await driver.tasks._inner.update_many(
        {"key": {"$in": keys[:25]}}, {"$set": {"state.status": "succeeded", "state.claimers": []}}
    )
    before = dict(flaky.calls)
    created = await publisher.send_many([Task(k, "job", {"again": True}) for k in keys], reset_finished=True)
    assert created == [True] * 25 + [False] * 25
    calls = {m: flaky.calls[m] - before.get(m, 0) for m in flaky.calls}
    assert calls.get("bulk_write") == 1, calls  # the resets: one write for the batch
    assert calls.get("update_many") == 1, calls  # clearing the reset marks
    assert calls.get("find") == 1, calls  # which were reset
    for key in keys[:25]:
        doc = await driver.get_task(key)
        assert doc is not None and doc["params"] == {"again": True} and doc["state"]["status"] == "pending"
        assert "reset_mark" not in doc["state"]
    assert (await driver.get_task(keys[30]))["params"] is None  # type: ignore[index]


async def test_a_session_error_is_not_wrapped() -> None:
    """StorageError is for errors we handled; inside a transaction PyMongo's own errors surface."""
    driver, flaky = await _driver_with_flaky()
    flaky.fail("bulk_write", OperationFailure("boom", code=2))
    with pytest.raises(OperationFailure):
        await Publisher(driver, clock=FakeClock(NOW)).send(Task("x", "job"), session=_Session())
    with pytest.raises(StorageError):
        flaky.fail("insert_many", OperationFailure("boom", code=2))
        await Publisher(driver, clock=FakeClock(NOW)).send(Task("y", "job"))
