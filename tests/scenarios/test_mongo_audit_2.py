"""The second real-server audit's correctness findings in the Mongo driver (issue 17 C, items
9-14), each on a fake of the collection that behaves as the server does where mongomock cannot
(replication lag, roles, server codes). The same paths on a real replica set: tests/real/test_audit_2.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.errors import AutoReconnect, BulkWriteError, OperationFailure, PyMongoError, WriteConcernError

from mscheduler import FakeClock, Publisher, Task, TaskOption
from mscheduler.cli.check import EXPECTED_INDEXES
from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.limits import Limit
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import (
    AcquireParams,
    AttemptReport,
    ChangeStreamUnsupported,
    ClaimParams,
    FinishParams,
    InsertPlanParams,
    PingParams,
    PutLimitParams,
    RetentionParams,
    SyncParentsParams,
)
from mscheduler.drivers.mongo.common import INDEXES, watch_error
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.conformance.support import assert_derived
from tests.scenarios.mongo_fakes import Database, Refusing, ReplicaSet, ServerIndexes
from tests.scenarios.test_mongo_reads_and_sessions import _Session, _SessionCollection
from tests.scenarios.test_mongo_retries import FlakyCollection, claim_params, entries, flaky_driver, publish

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
    """In a PSA set a claim may time out waiting for the majority (64) although the primary
    applied it. The recovery read must look where the write is: the primary at local read
    concern (a majority read alone misses it). Found there, it is run once a majority has it
    (issue 24 M5: one the majority never confirms is released, not run:
    tests/scenarios/test_mongo_audit_3.py)."""
    driver, rs = await replicated_driver()
    await Publisher(driver, clock=FakeClock(NOW)).send_many([Task("t1", "job"), Task("t2", "job")])
    await rs.replicate()  # the tasks themselves are majority-committed; the claim not yet

    def refuse_majority() -> None:
        raise wtimeout()

    rs.collection().after["find_one_and_update"] = refuse_majority
    majority_find = rs.snapshot.find_one

    async def catching_up(*args: Any, **kwargs: Any) -> Any:
        await rs.replicate()  # the majority catches up while the driver looks
        return await majority_find(*args, **kwargs)

    rs.snapshot.find_one = catching_up
    claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    assert [(c.key, c.attempt) for c in claimed] == [("t1", "a1")], "the applied claim is used"
    assert rs.reads["primary/local"] >= 1 and rs.reads["primary/majority"] >= 1
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
    assert (await driver.sync_parents(SyncParentsParams(["etl"], LATER))).changed >= 0
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
    changed index is rebuilt, an index whose options changed (85) too, and every index of this
    build exists."""
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
    await raw.insert_one({"_id": "old", "key": "old"})
    tasks = ServerIndexes(raw)
    driver = MongoDriver(Database(inner, {"mscheduler_tasks": tasks}), majority=False)
    await driver.setup()  # was: StorageError (86) before the later indexes were made
    indexes = {ix["name"]: ix async for ix in await _resolved(raw.list_indexes())}
    assert set(indexes) - {"_id_"} == set(EXPECTED_INDEXES)
    assert list(indexes["claimers_claim"]["key"]) == [k for k, _ in INDEX_KEYS["claimers_claim"]]
    assert indexes["unique_live"].get("unique") is True
    assert {"claimers_claim", "unique_live"} <= set(tasks.dropped)
    await driver.setup()  # again: nothing to rebuild
    assert tasks.dropped.count("claimers_claim") == 1


async def _resolved(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value


# -- item 14: the smaller ones ----------------------------------------------------------------------


async def test_a_lost_plan_insert_reply_is_recognised_on_a_tz_aware_client() -> None:
    """The recovery of a plan insert whose reply was lost compares the stored creation time with
    the one sent: aware (tz_aware client) against naive, it never matched and the plan was said
    to exist already (the caller's own plan refused)."""
    driver = MongoDriver(
        mongomock_database("tz", tz_aware=True), create_indexes=True, backoff=0.0005, max_backoff=0.002
    )
    await driver.setup()
    flaky = FlakyCollection(driver.plans)
    flaky.COROUTINES = (*FlakyCollection.COROUTINES, "insert_one")  # type: ignore[assignment]
    driver.plans = flaky
    flaky.fail("insert_one", AutoReconnect("connection reset"), after_apply=True)
    timing = PlanTiming(schedule=EverySchedule(interval=timedelta(minutes=1), start=NOW))
    plan = Plan(plan_id="p1", name="job", timing=timing).to_storage(NOW)
    assert await driver.insert_plan(InsertPlanParams(plan, NOW)) is True
    assert flaky.calls["insert_one"] == 1, "found by the recovery read, not sent again"


async def test_a_change_stream_refused_while_the_set_starts_is_reopened_not_given_up() -> None:
    """Code 94 (NotYetInitialized: the replica set has not initiated yet) names the replica set
    in its text; it was read as "no change streams here" and the consumer polled for life."""
    starting = OperationFailure("no replset config has been received; replica set not initialized", code=94)
    error = watch_error(starting, None)
    assert isinstance(error, StorageError) and error.transient
    for code in (40573, 40415, 115, 376):  # what does mean "cannot watch": by code, not by text
        assert isinstance(watch_error(OperationFailure("x", code=code), None), ChangeStreamUnsupported)


async def test_a_document_without_a_retry_budget_is_unlimited_not_exhausted() -> None:
    """``{$ne: [missing, null]}`` is true: a task document without
    ``option.max_unexpected_retries`` (written by hand, or by an earlier build) derived as out of
    budget at its first failure. Missing is unlimited, as the Python definition says."""
    driver = MongoDriver(mongomock_database(), create_indexes=True)
    await driver.setup()
    await publish(driver, "t1")
    await driver.tasks.update_one({"key": "t1"}, {"$unset": {"option.max_unexpected_retries": ""}})
    (claimed,) = await driver.claim(claim_params())
    failure = {"type": "RuntimeError", "message": "boom", "traceback": None}
    later = FinishParams("t1", "w1", claimed.attempt, LATER, "failed", error=failure, retry_at=LATER)
    assert await driver.finish([later]) == [True]
    doc = await driver.get_task("t1")
    assert doc is not None and doc["state"]["status"] == "pending"
    assert_derived(doc)


class _TransactionCollection(_SessionCollection):
    """mongomock has no sessions: this records the writes made in the caller's session and
    whether one of them failed (a write error inside a transaction aborts it on a server)."""

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if not callable(call) or name not in ("bulk_write", "update_many", "update_one", "insert_many"):
            return call

        async def in_transaction(*args: Any, **kwargs: Any) -> Any:
            inside = "session" in kwargs
            try:
                return await call(*args, **kwargs)
            except PyMongoError:
                if inside:
                    self.__dict__["aborted"] = True
                raise

        return in_transaction


async def test_a_reset_in_a_transaction_whose_params_are_taken_leaves_the_transaction_alive() -> None:
    """``send_many(..., reset_finished=True, session=s)``: a finished task whose params hash a
    live task holds is not reset (reported not created). The reset's duplicate key error aborted
    the caller's transaction; the hash is now read first, in the session, and that task skipped."""
    driver = MongoDriver(mongomock_database(), create_indexes=True, backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    collection = _TransactionCollection(driver.tasks)
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = collection
    publisher = Publisher(driver, clock=FakeClock(NOW))
    option = TaskOption(max_unexpected_retries=0)
    assert await publisher.send(Task("a", "job", {"n": 1}, unique_by="params", option=option))
    (claimed,) = await driver.claim(claim_params())
    failure = {"type": "RuntimeError", "message": "boom", "traceback": None}
    assert await driver.finish([FinishParams("a", "w1", claimed.attempt, LATER, "failed", error=failure)])
    assert await publisher.send(Task("b", "job", {"n": 1}, unique_by="params"))
    # (one task per call: mongomock numbers the upserts of a bulk write wrongly)
    again = Task("a", "job", {"n": 1}, unique_by="params")
    assert await publisher.send(again, reset_finished=True, session=_Session()) is False
    assert not collection.__dict__.get("aborted"), "no write error inside the caller's transaction"
    doc = await driver.get_task("a")
    assert doc is not None and doc["state"]["status"] == "failed"


class _TooLargeFor:
    """A collection on which a claim of the documents in ``bad`` fails as too large (17419: the
    document after the update would pass 16 MiB). ``meanwhile`` runs once, just before the first
    refusal: what another process does between the failed claim and the driver's next read."""

    def __init__(self, inner: Any, bad: set[str], meanwhile: Any = None) -> None:
        self._inner = inner
        self.bad = bad
        self.meanwhile = meanwhile

    async def find_one_and_update(self, filter_: Any, update: Any, *, sort: Any = None, **kwargs: Any) -> Any:
        cursor = self._inner.find(filter_, {"key": 1})
        if sort:
            cursor = cursor.sort(sort)
        head = [doc["key"] async for doc in cursor.limit(1)]
        if head and head[0] in self.bad:
            if self.meanwhile is not None:
                hook, self.meanwhile = self.meanwhile, None
                await hook()
            raise OperationFailure("Resulting document after update is larger than 16777216", code=17419)
        return await self._inner.find_one_and_update(filter_, update, sort=sort, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_claim_too_large_for_its_task_marks_that_task_not_the_new_head() -> None:
    """After a claim fails because its task cannot take another entry, the driver marked
    whatever headed the claim order at the next read: a healthy task that arrived in between
    (a higher priority) was failed for good instead. The failing task itself is now identified:
    the claim is tried again on the head's key alone, and only a task that fails that way too is
    marked broken (a healthy head is simply claimed)."""
    driver = MongoDriver(mongomock_database(), create_indexes=True, backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    await publish(driver, "big", priority=5)
    await publish(driver, "t2")

    async def healthy_arrives() -> None:
        await publish(driver, "h", priority=9)

    refusing = _TooLargeFor(driver.tasks, {"big"}, healthy_arrives)
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = refusing
    first = await driver.claim(claim_params("w1"))
    h = await driver.get_task("h")
    assert h is not None and h["state"].get("broken") is None, "the healthy task is not marked"
    assert [c.key for c in first] == ["h"], "the healthy head is claimed"
    assert await driver.claim(claim_params("w2")) == [], "big heads the order: it fails again"
    assert [c.key for c in await driver.claim(claim_params("w3"))] == ["t2"]
    big = await driver.get_task("big")
    assert big is not None and big["state"]["broken"]["type"] == "TaskDocumentError"
    assert big["state"]["status"] == "failed"
