"""The second audit's correctness findings (issue 17 C) on a real replica set: the paths the fakes
of tests/scenarios/test_mongo_audit_2.py stand in for. Faults come from the server's own
``failCommand`` fail point (``--setParameter enableTestCommands=1``, as the CI workflow starts
mongod); where the server has none, the tests that need one skip."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from mscheduler import FakeClock, MongoDriver, Publisher, Task, TaskOption
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import ClaimParams, FinishParams, RetentionParams
from mscheduler.drivers.mongo.common import INDEX_NAMES, INDEXES
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
]

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


@contextlib.asynccontextmanager
async def fail_command(database: Any, app: str, data: dict[str, Any], times: int = 1) -> AsyncIterator[None]:
    """The server's ``failCommand`` fail point for the next ``times`` matching commands of the
    clients named ``app`` (so other tests' commands are left alone); off afterwards."""
    admin = database.client.admin
    command = {"configureFailPoint": "failCommand", "mode": {"times": times}, "data": data | {"appName": app}}
    try:
        await admin.command(command)
    except OperationFailure as exc:
        pytest.skip(f"the server has no failCommand fail point (enableTestCommands): {exc}")
    try:
        yield
    finally:
        await admin.command({"configureFailPoint": "failCommand", "mode": "off"})


async def driver_with_app(database: Any, app: str) -> MongoDriver:
    """A driver on ``database`` through a client of its own, named ``app`` for the fail points."""
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(REAL_URI, appname=app)
    driver = MongoDriver(client[database.name])
    await driver.setup()
    return driver


async def test_a_claim_whose_write_concern_timed_out_is_used(real_database: Any) -> None:
    """Item 9: the claim is applied, its reply says 64 (waiting for the majority timed out); the
    recovery read on the primary finds the attempt and the claim is used, applied once."""
    app = f"audit2-{uuid.uuid4().hex[:6]}"
    driver = await driver_with_app(real_database, app)
    try:
        await Publisher(driver, clock=FakeClock(NOW)).send_many([Task("t1", "job"), Task("t2", "job")])
        data = {
            "failCommands": ["findAndModify"],
            "writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"},
        }
        async with fail_command(real_database, app, data):
            claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
        assert [(c.key, c.attempt) for c in claimed] == [("t1", "a1")]
        doc = await driver.get_task("t1")
        assert doc is not None and [e["attempt"] for e in doc["state"]["worker_states"]] == ["a1"]
    finally:
        await driver.database.client.close()


async def test_a_batched_finish_answered_with_write_concern_errors_only_is_not_a_failure(
    real_database: Any,
) -> None:
    """Item 11: a bulk write (the batched finish) whose reply holds only write-concern errors
    (PyMongo's BulkWriteError, 65) was applied: read back, accepted, not raised as permanent."""
    app = f"audit2-{uuid.uuid4().hex[:6]}"
    driver = await driver_with_app(real_database, app)
    try:
        await Publisher(driver, clock=FakeClock(NOW)).send_many([Task("t1", "job"), Task("t2", "job")])
        claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1", "a2"], LEASE))
        later = NOW + timedelta(seconds=1)
        outcomes = [FinishParams(c.key, "w1", c.attempt, later, "succeeded", result=c.key) for c in claimed]
        data = {
            "failCommands": ["update"],
            "writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"},
        }
        async with fail_command(real_database, app, data):
            assert await driver.finish(outcomes) == [True, True]
        for c in claimed:
            doc = await driver.get_task(c.key)
            assert doc is not None and doc["state"]["status"] == "succeeded"
    finally:
        await driver.database.client.close()


async def test_a_changed_retention_without_collmod_rights_rebuilds_the_ttl_indexes(
    real_database: Any,
) -> None:
    """Item 12: ``collMod`` refused as Unauthorized (13: the readWrite role has none) while a
    retention period changes: the TTL index is dropped and made again with the new period, and
    ``setup()`` goes on (it stopped there)."""
    app = f"audit2-{uuid.uuid4().hex[:6]}"
    week = await driver_with_app(real_database, app)
    try:
        week_events = MongoDriver(week.database, events=True, event_retention=timedelta(days=7))
        await week_events.setup()
        await week.ensure_retention(RetentionParams({"succeeded": timedelta(days=10)}))
        day = MongoDriver(week.database, events=True, event_retention=timedelta(days=1))
        async with fail_command(real_database, app, {"failCommands": ["collMod"], "errorCode": 13}, times=2):
            await day.setup()
            await day.ensure_retention(RetentionParams({"succeeded": timedelta(days=5)}))
        events = {ix["name"]: ix async for ix in await day.events.list_indexes()}
        tasks = {ix["name"]: ix async for ix in await day.tasks.list_indexes()}
        assert events["events_ttl"]["expireAfterSeconds"] == 86_400
        assert tasks["retention_succeeded"]["expireAfterSeconds"] == 5 * 86_400
    finally:
        await week.database.client.close()


async def test_setup_upgrades_a_store_made_with_the_previous_index_specs(real_database: Any) -> None:
    """An index whose spec changed (``claimers_claim`` without ``key``, a non-unique
    ``unique_live``): createIndexes answers 86 / 85; setup() rebuilds the changed indexes and
    makes every index of this build."""
    tasks = real_database["mscheduler_tasks"]
    await tasks.create_index(
        [("state.claimers", 1), ("option.priority", -1), ("state.targeted", -1), ("state.claim_at", 1)],
        name="claimers_claim",
    )
    await tasks.create_index("state.unique_live", name="unique_live")
    driver = MongoDriver(real_database)
    await driver.setup()
    indexes = {ix["name"]: ix async for ix in await tasks.list_indexes()}
    assert set(indexes) - {"_id_"} == set(INDEX_NAMES)
    wanted = dict((options["name"], keys) for keys, options in INDEXES)
    assert list(indexes["claimers_claim"]["key"].items()) == [(k, v) for k, v in wanted["claimers_claim"]]
    assert indexes["unique_live"].get("unique") is True


async def test_a_tz_aware_client_keeps_one_write_per_claim(real_database: Any) -> None:
    """With ``tz_aware=True`` the server's dates come back aware: a claim is still one command,
    its lease computed inside it (the task's timeout after ``now``, capped by ``max_lease``)."""
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(REAL_URI, tz_aware=True)
    try:
        driver = MongoDriver(client[real_database.name])
        await driver.setup()
        await Publisher(driver, clock=FakeClock(NOW)).send(Task("t1", "job"))
        before = driver.commands
        (claimed,) = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
        assert driver.commands - before == 1
        assert NOW < claimed.ping_expire_time <= NOW + LEASE
    finally:
        await client.close()


async def test_a_reset_in_a_transaction_whose_params_are_taken_commits(real_database: Any) -> None:
    """Item 14: a reset whose params hash a live task holds is skipped (not created); its
    duplicate key error used to abort the caller's transaction."""
    driver = MongoDriver(real_database)
    await driver.setup()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    option = TaskOption(max_unexpected_retries=0)
    assert await publisher.send(Task("a", "job", {"n": 1}, unique_by="params", option=option))
    (claimed,) = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    failure = {"type": "RuntimeError", "message": "boom", "traceback": None}
    later = NOW + timedelta(seconds=1)
    assert await driver.finish([FinishParams("a", "w1", claimed.attempt, later, "failed", error=failure)])
    assert await publisher.send(Task("b", "job", {"n": 1}, unique_by="params"))
    orders = real_database["orders"]
    await orders.insert_one({"_id": "seed"})

    async def work(session: Any) -> list[bool]:
        await orders.insert_one({"_id": "o1"}, session=session)
        again = [Task("a", "job", {"n": 1}, unique_by="params"), Task("c", "job", {"n": 2})]
        return await publisher.send_many(again, reset_finished=True, session=session)

    async with real_database.client.start_session() as session:
        assert await session.with_transaction(work) == [False, True]
    assert await orders.count_documents({"_id": "o1"}) == 1, "the transaction committed"


async def test_a_change_stream_refused_while_the_set_starts_is_opened_again(real_database: Any) -> None:
    """Item 14: an aggregate refused with 94 (NotYetInitialized) is a passing error: the watcher
    reopens (it used to read "replica set" in the text as "no change streams" and poll for life)."""
    app = f"audit2-{uuid.uuid4().hex[:6]}"
    driver = await driver_with_app(real_database, app)
    try:
        async with fail_command(real_database, app, {"failCommands": ["aggregate"], "errorCode": 94}):
            with pytest.raises(StorageError) as refused:
                await anext(aiter(driver.watch(["job"])))
        assert refused.value.transient
    finally:
        await driver.database.client.close()
