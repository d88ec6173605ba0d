"""The second real-server audit's correctness findings in the Mongo driver (issue 17 C, items
9-14), each on a fake of the collection that behaves as the server does where mongomock cannot
(replication lag, roles, server codes). The same paths on a real replica set: tests/real/test_audit_2.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.errors import BulkWriteError, WriteConcernError

from mscheduler import FakeClock, Publisher, Task
from mscheduler.cli.check import EXPECTED_INDEXES
from mscheduler.domain.limits import Limit
from mscheduler.drivers.base import (
    AcquireParams,
    AttemptReport,
    ClaimParams,
    FinishParams,
    PingParams,
    PutLimitParams,
    RetentionParams,
    SyncParentsParams,
)
from mscheduler.drivers.mongo.common import INDEXES
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.mongo_fakes import Database, Refusing, ReplicaSet, ServerIndexes
from tests.scenarios.test_mongo_retries import claim_params, entries, flaky_driver, publish

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
LATER = NOW + timedelta(seconds=1)
INDEX_KEYS = {options["name"]: keys for keys, options in INDEXES}


def wtimeout() -> WriteConcernError:
    return WriteConcernError("waiting for replication timed out", code=64, details={})


async def replicated_driver() -> tuple[MongoDriver, ReplicaSet]:
    rs = ReplicaSet()
    database = Database(mongomock_database(), {"mscheduler_tasks": rs.collection()})
    driver = MongoDriver(database, majority=False, backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    return driver, rs


# -- item 9: a claim whose majority write timed out is on the primary, not in the majority view ----


async def test_a_claim_whose_majority_write_timed_out_is_found_on_the_primary_and_run() -> None:
    """In a PSA set with its secondary down every claim times out waiting for the majority (64)
    although the primary applied it. The recovery read must look where the write is: the primary
    at local read concern. (A majority read misses it: the consumer never runs the task, which
    later ends lost and costs budget.)"""
    driver, rs = await replicated_driver()
    await Publisher(driver, clock=FakeClock(NOW)).send_many([Task("t1", "job"), Task("t2", "job")])
    await rs.replicate()  # the tasks themselves are majority-committed; the claim will not be

    def refuse_majority() -> None:
        raise wtimeout()

    rs.collection().after["find_one_and_update"] = refuse_majority
    claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    assert [(c.key, c.attempt) for c in claimed] == [("t1", "a1")], "the applied claim is used"
    assert rs.reads["primary/local"] >= 1 and rs.reads["primary/majority"] == 0
    doc = await rs.primary.find_one({"key": "t1"})
    assert doc is not None
    assert [e["attempt"] for e in doc["state"]["worker_states"]] == ["a1"], "claimed once, not twice"


# -- item 11: a bulk write whose only errors are write-concern errors was applied -----------------


def wc_only_bulk_error(matched: int, code: int = 64) -> BulkWriteError:
    """What a bulk write answers when every write was applied on the primary but the majority did
    not confirm in time: code 65, no write errors, write-concern errors only."""
    details = {
        "writeErrors": [],
        "writeConcernErrors": [{"code": code, "errmsg": "waiting for replication timed out"}],
        "nMatched": matched,
        "nModified": matched,
        "nUpserted": 0,
        "nInserted": 0,
        "nRemoved": 0,
        "upserted": [],
    }
    return BulkWriteError(details)


async def test_a_batched_finish_answered_with_write_concern_errors_only_is_read_back_not_failed() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1", "t2")
    claimed = await driver.claim(claim_params(n=2))
    outcomes = [FinishParams(c.key, "w1", c.attempt, LATER, "succeeded", result=c.key) for c in claimed]
    flaky.fail("bulk_write", wc_only_bulk_error(2), after_apply=True)
    assert await driver.finish(outcomes) == [True, True], "applied: read back, not a failure"
    for c in claimed:
        (entry,) = await entries(driver, c.key)
        assert (entry["status"], entry["result"]) == ("succeeded", c.key)


async def test_a_ping_with_reports_answered_with_write_concern_errors_only_goes_on() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    (claimed,) = await driver.claim(claim_params())
    report = AttemptReport(seq=1, save_checkpoint=True, checkpoint={"page": 3})
    params = PingParams("w1", LATER, {NOW + LEASE * 2: {"t1": claimed.attempt}}, reports={"t1": report})
    flaky.fail("bulk_write", wc_only_bulk_error(1), after_apply=True)
    result = await driver.ping(params)
    assert list(result.alive) == ["t1"] and result.recorded == ["t1"]


async def test_a_parent_sync_answered_with_write_concern_errors_only_goes_on() -> None:
    driver, flaky = await flaky_driver()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await publisher.send(Task("etl", "etl", children=["fetch", "load"]))
    (child,) = await driver.claim(ClaimParams("w1", ["fetch"], NOW, ["a1"], LEASE))
    assert await driver.finish([FinishParams(child.key, "w1", "a1", LATER, "succeeded")]) == [True]
    flaky.fail("bulk_write", wc_only_bulk_error(1), after_apply=True)
    assert await driver.sync_parents(SyncParentsParams(["etl"], LATER)) >= 0
    parent = await driver.get_task("etl")
    assert parent is not None
    assert [c["status"] for c in parent["state"]["children"]] == ["succeeded", "pending"]


# -- item 12: the readWrite role has no collMod: a changed TTL period is rebuilt instead -----------


async def _index(collection: Any, name: str) -> dict[str, Any] | None:
    cursor = collection.list_indexes()
    cursor = await cursor if hasattr(cursor, "__await__") else cursor
    found = [dict(ix) async for ix in cursor if ix["name"] == name]
    return found[0] if found else None


async def test_a_changed_event_retention_without_collmod_rights_rebuilds_the_ttl_index() -> None:
    inner = mongomock_database()
    events = ServerIndexes(inner["mscheduler_events"])
    database = Refusing(inner, {"mscheduler_events": events}, {"collMod": 13})
    events.database = database
    week = MongoDriver(database, majority=False, events=True, event_retention=timedelta(days=7))
    await week.setup()
    day = MongoDriver(database, majority=False, events=True, event_retention=timedelta(days=1))
    await day.setup()  # was: StorageError (configuration) from the refused collMod; setup stopped
    assert database.commands == ["collMod"]
    assert "events_ttl" in events.dropped
    ttl = await _index(inner["mscheduler_events"], "events_ttl")
    assert ttl is not None and ttl["expireAfterSeconds"] == 86_400
    assert await _index(inner["mscheduler_events"], "events_written") is not None, "setup went on"


async def test_a_changed_retention_period_without_collmod_rights_rebuilds_the_ttl_index() -> None:
    inner = mongomock_database()
    tasks = ServerIndexes(inner["mscheduler_tasks"])
    database = Refusing(inner, {"mscheduler_tasks": tasks}, {"collMod": 13})
    tasks.database = database
    driver = MongoDriver(database, majority=False)
    await driver.setup()

    async def honours_partial_ttl() -> bool:  # a real server's TTL monitor does; mongomock's not
        return True

    driver._probe_partial_ttl = honours_partial_ttl  # type: ignore[method-assign]
    assert await driver.ensure_retention(RetentionParams({"succeeded": timedelta(days=10)}))
    assert await driver.ensure_retention(RetentionParams({"succeeded": timedelta(days=5)}))
    assert database.commands == ["collMod"]
    assert tasks.dropped == ["retention_succeeded"]
    ttl = await _index(inner["mscheduler_tasks"], "retention_succeeded")
    assert ttl is not None and ttl["expireAfterSeconds"] == 5 * 86_400


# -- item 13: scheduler decisions read the primary, whatever the client's read preference ---------


async def test_held_slots_and_get_tasks_read_the_primary_not_a_stale_secondary() -> None:
    """A remote executor's ping reaching another API server reads which limit holds its slot
    (``held_slots``) and the task's options (``get_tasks``). From a lagging secondary the slot is
    not there yet: the renewal skips the slot, the attempt is answered lost or, worse, its lease is
    renewed while its slot runs out, and ``max_running`` can be exceeded."""
    tasks_rs, limits_rs = ReplicaSet(), ReplicaSet("mscheduler_limits")
    database = Database(
        mongomock_database(),
        {"mscheduler_tasks": tasks_rs.collection(), "mscheduler_limits": limits_rs.collection()},
    )
    driver = MongoDriver(database, majority=False)
    await driver.setup()
    await Publisher(driver, clock=FakeClock(NOW)).send(Task("t1", "job"))
    await driver.put_limit(PutLimitParams("job", Limit(key="job", max_running=2).to_storage(), NOW))
    await limits_rs.replicate()
    await tasks_rs.replicate()
    granted = await driver.acquire_slots(AcquireParams("job", "w1", ["a1"], NOW, NOW + LEASE))
    assert granted.granted == ["a1"]
    # the grant is on the primary only (the secondary lags)
    assert await driver.held_slots("w1", ["a1"], NOW) == {"a1": "job"}
    assert len(await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))) == 1
    (doc,) = await driver.get_tasks(["t1"])
    assert [e["attempt"] for e in doc["state"]["worker_states"]] == ["a1"]
    assert tasks_rs.reads["secondarypreferred/local"] == 0


# -- item 10: an index whose spec changed since the build that made the store ---------------------


async def test_setup_on_a_store_of_the_previous_build_rebuilds_changed_indexes_and_makes_the_rest() -> None:
    """``claimers_claim`` gained ``key`` under the same name: createIndexes answers 86 on a store
    the previous build made, and setup() stopped there, before the later indexes existed. Now the
    changed index is rebuilt, an index whose options changed (85) too, the retired names of
    earlier builds are dropped, and every index of this build exists."""
    inner = mongomock_database()
    raw = inner["mscheduler_tasks"]
    previous_claim = [
        ("state.claimers", 1),
        ("option.priority", -1),
        ("state.targeted", -1),
        ("state.claim_at", 1),
    ]
    await raw.create_index(previous_claim, name="claimers_claim")
    await raw.create_index("state.unique_live", name="unique_live")  # not unique: options changed
    await raw.create_index([("state.status", 1)], name="status")  # a retired name
    await raw.insert_one({"_id": "old", "key": "old"})
    tasks = ServerIndexes(raw)
    driver = MongoDriver(Database(inner, {"mscheduler_tasks": tasks}), majority=False)
    await driver.setup()  # was: StorageError (86) before the later indexes were made
    indexes = {ix["name"]: ix async for ix in await _resolved(raw.list_indexes())}
    assert set(indexes) - {"_id_"} == set(EXPECTED_INDEXES)
    assert list(indexes["claimers_claim"]["key"]) == [k for k, _ in INDEX_KEYS["claimers_claim"]]
    assert indexes["unique_live"].get("unique") is True
    assert {"claimers_claim", "unique_live", "status"} <= set(tasks.dropped)
    await driver.setup()  # again: nothing to rebuild
    assert tasks.dropped.count("claimers_claim") == 1


async def _resolved(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value
