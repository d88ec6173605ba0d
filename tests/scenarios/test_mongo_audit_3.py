"""The third real-server audit's findings in the Mongo driver (issue 24 A), each shown on
mongomock or on a fake of the collection that answers as the server does where mongomock cannot
(write-concern errors, a stepped-down primary, a mongos). What only a server can show is in
tests/real/test_audit_3.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import UpdateOne
from pymongo.errors import AutoReconnect, BulkWriteError, OperationFailure, WriteConcernError

from mscheduler import (
    EverySchedule,
    FakeClock,
    Operations,
    OptionChange,
    Plan,
    Planner,
    PlanTiming,
    Publisher,
    Task,
    TaskOption,
)
from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.partitions import part_of
from mscheduler.drivers.base import AttemptReport, ClaimParams, ExpireParams, FinishParams, PingParams
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.mongo_fakes import Database

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


async def index_names(database: Any) -> set[str]:
    return {ix["name"] async for ix in database["mscheduler_tasks"].list_indexes()}


# -- M1: a request path checks the store, it never builds, drops or rebuilds an index --------------


async def test_operations_send_checks_the_store_and_changes_no_index() -> None:
    database = mongomock_database()
    await MongoDriver(database).setup()
    # an index this build does not make: a request path leaves it as it is
    await database["mscheduler_tasks"].create_index([("state.status", 1)], name="claim")
    before = await index_names(database)
    ops = Operations(MongoDriver(database, create_indexes=False))
    assert await ops.send(Task("t", "job"), allow_unknown=True)
    assert await index_names(database) == before

    fresh = mongomock_database("never_set_up")
    with pytest.raises(StorageError) as refused:
        await Operations(MongoDriver(fresh, create_indexes=False)).send(Task("t", "job"), allow_unknown=True)
    assert refused.value.config and "mscheduler setup" in str(refused.value)
    assert await fresh.list_collection_names() == [], "no layout recorded, no index built"


# -- H2: a send inside the caller's transaction names the whole shard key --------------------------


class Recording:
    """The tasks collection, recording each write's filters (and the session-less mongomock call)."""

    WRITES = ("find_one_and_update", "find_one_and_delete", "update_one")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.single: list[tuple[str, Mapping[str, Any], dict[str, Any]]] = []  # (method, filter, kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in (*self.WRITES, "bulk_write"):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("session", None)  # mongomock has no sessions
            if name == "bulk_write":
                for op in args[0]:
                    if isinstance(op, UpdateOne):
                        self.single.append(("UpdateOne", op._filter, {"upsert": op._upsert}))
            else:
                self.single.append((name, args[0], kwargs))
            return await attr(*args, **kwargs)

        return call


async def recording_driver(partitions: int = 4) -> tuple[MongoDriver, Recording]:
    driver = MongoDriver(mongomock_database(), partitions=partitions)
    await driver.setup()
    recording = Recording(driver.tasks)
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = recording
    return driver, recording


async def test_a_transactional_send_upserts_on_the_whole_shard_key() -> None:
    driver, recording = await recording_driver()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    keys = [f"t-{i}" for i in range(8)]
    assert await publisher.send_many([Task(k, "job", {"k": k}) for k in keys], session=object()) == [True] * 8
    upserts = [f for what, f, more in recording.single if what == "UpdateOne" and more["upsert"]]
    assert upserts == [{"_id": k, "part": part_of(k, 4)} for k in keys]
    for key in keys:  # the inserted task is whole: _id and part from the filter, the rest set on insert
        doc = await driver.get_task(key)
        assert doc is not None and (doc["key"], doc["part"], doc["params"]) == (
            key,
            part_of(key, 4),
            {"k": key},
        )
    assert await publisher.send(Task("t-0", "job"), session=object()) is False


# -- M2: every single-document write about a known task names its _id ------------------------------


async def test_every_single_task_write_names_the_task_id() -> None:
    """Publish, claim (by the claim order and by key), ping with a checkpoint, finish, fail and
    retry, the lease pass, every control, edits, a status by hand, a family's sync, a reset: each
    findAndModify, single update and bulk single update names the task's _id, except the one
    write that cannot know it, the claim in the claim order (its partition only)."""
    driver, recording = await recording_driver()
    clock = FakeClock(NOW)
    ops = Operations(driver, clock=clock)
    publisher = Publisher(driver, clock=clock)
    keys = [f"t-{i}" for i in range(8)]
    await publisher.send_many([Task(k, "job", option=TaskOption(retry_delay=timedelta(0))) for k in keys])
    await publisher.send(Task("fam", "job", children=["a", "b"]))
    claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, [f"a{i}" for i in range(4)], LEASE))
    assert len(claimed) == 4
    report = AttemptReport(seq=1, checkpoint={"n": 1}, save_checkpoint=True)
    expiry = NOW + LEASE
    await driver.ping(
        PingParams("w1", NOW, {expiry: {c.key: c.attempt for c in claimed}}, reports={claimed[0].key: report})
    )
    error = {"type": "E", "message": "m", "traceback": None}
    await driver.finish([FinishParams(claimed[0].key, "w1", claimed[0].attempt, NOW, "succeeded")])
    await driver.finish(
        [FinishParams(claimed[1].key, "w1", claimed[1].attempt, NOW, "failed", None, error, NOW)]
    )
    pinned = ClaimParams("w1", [f"n{i}" for i in range(120)] + ["job"], NOW, ["p1"], LEASE)
    await driver.claim(pinned)  # over 200 claimer tokens: heads read, then claimed by key
    await driver.expire_leases(ExpireParams(NOW + 2 * LEASE))
    rest = [k for k in keys if k not in {c.key for c in claimed}]
    await ops.pause(rest[0])
    await ops.resume(rest[0])
    await ops.cancel(rest[1])
    await ops.restart(rest[1])
    await ops.edit(rest[2], OptionChange(priority=3))
    await ops.set_status(rest[3], "succeeded")
    await publisher.send(Task(rest[3], "job"), reset_finished=True)
    await ops.set_child_status("fam", "a", "succeeded")
    await ops.remove(rest[0])
    unnamed = [
        (what, f)
        for what, f, more in recording.single
        if "_id" not in f and not ("$and" in f and any("_id" in c for c in f["$and"]))
    ]
    claims = [f for what, f in unnamed if what == "find_one_and_update" and "state.claimers" in f]
    assert [w for w, f in unnamed if f not in claims] == [], unnamed
    assert claims and all("part" in f for f in claims), "the claim in the claim order names its partition"
    kinds = {what for what, _, _ in recording.single}
    assert {"find_one_and_update", "find_one_and_delete", "update_one", "UpdateOne"} <= kinds


# -- M2: a sharded store's mongos must route a claim by its partition ------------------------------


class Mongos:
    """A mongomock database that answers ``buildInfo`` as a mongos of ``version`` and the explain of
    a claim as such a mongos does (``refuses``: code 61, as a release without SERVER-44422)."""

    def __init__(self, inner: Any, version: str, refuses: bool) -> None:
        self._inner = inner
        self.name = inner.name
        self.version = version
        self.refuses = refuses
        self.explained: list[dict[str, Any]] = []

    def __getitem__(self, name: str) -> Any:
        return self._inner[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def command(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        name = command if isinstance(command, str) else next(iter(command))
        if name == "buildInfo":
            return {"version": self.version}
        if name == "hello":
            return {"msg": "isdbgrid"}
        if name == "explain":
            self.explained.append(command)
            if self.refuses:
                raise OperationFailure("Query for sharded findAndModify must contain the shard key", code=61)
            return {"queryPlanner": {}}
        return await self._inner.command(command, *args, **kwargs)


@pytest.mark.parametrize(
    ("version", "refuses", "accepted", "explained"),
    [
        ("8.0.4", False, True, False),
        ("7.1.0", False, True, False),
        ("7.0.14", False, True, True),
        ("6.0.3", True, False, True),
        ("5.0.9", True, False, True),
        ("4.4.29", False, False, False),
    ],
)
async def test_prepare_on_a_sharded_store_checks_that_the_mongos_routes_claims(
    version: str, refuses: bool, accepted: bool, explained: bool
) -> None:
    inner = mongomock_database()
    await MongoDriver(inner, partitions=4, sharded=True).setup()
    mongos = Mongos(inner, version, refuses)
    driver = MongoDriver(mongos, majority=False, create_indexes=False)
    if accepted:
        await driver.prepare()
    else:
        with pytest.raises(StorageError) as refused:
            await driver.prepare()
        assert refused.value.config and "SERVER-44422" in str(refused.value) and version in str(refused.value)
    assert bool(mongos.explained) == explained


# -- L6 / L8: reads by key name the partitions; the planner reads the primary ----------------------


class Reads:
    """The tasks (or plans) collection, recording each read's filter and the view it was read on."""

    def __init__(self, inner: Any, view: str, log: list[tuple[str, str, Any]]) -> None:
        self._inner, self._view, self._log = inner, view, log

    def with_options(self, **options: Any) -> Reads:
        pref = options.get("read_preference")
        view = f"{self._view.split('/')[0]}/{pref.name.lower() if pref is not None else 'default'}"
        return Reads(self._inner, view, self._log)

    def find(self, filter_: Any, *args: Any, **kwargs: Any) -> Any:
        self._log.append((self._view, "find", filter_))
        return self._inner.find(filter_, *args, **kwargs)

    async def find_one(self, filter_: Any, *args: Any, **kwargs: Any) -> Any:
        self._log.append((self._view, "find_one", filter_))
        return await self._inner.find_one(filter_, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_reads_by_key_name_their_partitions_and_the_planner_reads_the_primary() -> None:
    inner = mongomock_database()
    await MongoDriver(inner, partitions=4).setup()
    log: list[tuple[str, str, Any]] = []
    tasks = Reads(inner["mscheduler_tasks"], "tasks/default", log)
    plans = Reads(inner["mscheduler_plans"], "plans/default", log)
    database = Database(inner, {"mscheduler_tasks": tasks, "mscheduler_plans": plans})
    driver = MongoDriver(database, majority=False)
    clock = FakeClock(NOW)
    ops = Operations(driver, clock=clock)
    keys = [f"t-{i}" for i in range(8)]
    await Publisher(driver, clock=clock).send_many([Task(k, "job") for k in keys])
    await ops.get_task("t-0")
    await ops.get_tasks(keys)
    schedule = EverySchedule(interval=timedelta(hours=1), start=NOW)
    await ops.add_plan(Plan(plan_id="p", name="job", timing=PlanTiming(schedule=schedule)))
    planner = Planner(driver, clock=clock)
    await planner.run_once()
    clock.advance(timedelta(hours=1))
    await planner.run_once()  # reads the first run's outcome
    claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    await driver.finish([FinishParams(claimed[0].key, "w9", "not-ours", NOW, "succeeded")])  # read back
    by_key = [(view, f) for view, what, f in log if view.startswith("tasks") and "key" in f]
    assert by_key and all("part" in f for _, f in by_key), by_key
    planner_reads = [view for view, what, f in log if view.startswith("plans") and "due_time" in f]
    assert planner_reads and set(planner_reads) == {"plans/primary"}, planner_reads
    outcome_reads = [view for view, what, f in log if view.startswith("tasks") and _plan_runs(f)]
    assert outcome_reads and set(outcome_reads) == {"tasks/primary"}, outcome_reads


def _plan_runs(filter_: dict[str, Any]) -> bool:
    """A read of plans' run tasks by key (the planner's outcome read)."""
    keys = filter_.get("key")
    return isinstance(keys, dict) and all(str(k).startswith("plan:") for k in keys.get("$in", [None]))


# -- L4: an update reported as a whole ``state`` object still wakes consumers ------------------------


async def test_the_stream_reads_claimers_and_stops_from_a_whole_state_object() -> None:
    """The server's diff of a pipeline update may report ``state`` whole (most of its fields
    changed, a restart's say) instead of ``state.claimers``, ``state.claim_at``, ``state.stop``:
    the event carries them either way (run by mongomock's aggregation over change-shaped
    documents; a server's own reports in tests/real/test_audit_3.py)."""
    when = datetime(2030, 1, 1, 12, 0)
    stop = {"action": "cancel", "time": when, "attempts": ["a1"]}
    changes = [
        {"wake": 2, "state": {"claimers": ["job|*"], "claim_at": when, "status": "pending"}},
        {"wake": 3, "state": {"claimers": [], "stop": stop, "status": "running"}},
        {"wake": 4, "state.claimers": ["job|w1"], "state.claim_at": when},
    ]
    database = mongomock_database()
    scratch = database["changes"]
    await scratch.insert_many(
        [
            {
                "_id": {"_data": f"u{i}"},
                "operationType": "update",
                "documentKey": {"_id": f"t{i}"},
                "updateDescription": {"updatedFields": fields, "removedFields": [], "truncatedArrays": []},
            }
            for i, fields in enumerate(changes)
        ]
    )
    events = [
        MongoDriver._event(doc, doc["_id"])
        async for doc in scratch.aggregate(MongoDriver(database)._watch_pipeline())
    ]
    assert [(e.key, e.claimers, e.claim_at, e.stop, e.stop_attempts) for e in events if e is not None] == [
        ("t0", ("job|*",), when.replace(tzinfo=UTC), None, None),
        ("t1", (), None, "cancel", ("a1",)),
        ("t2", ("job|w1",), when.replace(tzinfo=UTC), None, None),
    ]


# -- L5: a count is an operator's read: it gives up after ADMIN_READ_MS ----------------------------


async def test_counting_tasks_carries_the_operators_time_limit() -> None:
    from mscheduler.domain.listing import ListParams
    from mscheduler.drivers.mongo.common import ADMIN_READ_MS

    driver = MongoDriver(mongomock_database())
    await driver.setup()
    seen: list[dict[str, Any]] = []
    count_documents = driver.tasks.count_documents

    async def counting(filter_: Any, **kwargs: Any) -> int:
        seen.append(kwargs)
        return int(await count_documents(filter_, **{k: v for k, v in kwargs.items() if k != "maxTimeMS"}))

    driver.tasks.count_documents = counting
    assert await driver.count_tasks(ListParams(), 100) == 0
    assert seen and seen[0].get("maxTimeMS") == ADMIN_READ_MS


# -- L2: shard() again after the shards changed moves the zones ----------------------------------------


class ZoningMongos:
    """A mongos's zone commands over ``config.tags`` (a mongomock collection): a range that
    overlaps another is refused, as the server refuses it; listShards names each shard's zones."""

    def __init__(self, shards: int) -> None:
        self.config = mongomock_database(f"config_{id(self)}")
        self.tags: dict[str, set[str]] = {f"rs{i}": set() for i in range(shards)}
        self.sent: list[dict[str, Any]] = []

    def __getitem__(self, name: str) -> Any:
        return self.config

    @property
    def admin(self) -> ZoningMongos:
        return self

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        name = next(iter(command))
        self.sent.append(command)
        ranges = self.config["tags"]
        if name == "listShards":
            return {"shards": [{"_id": s, "tags": sorted(t)} for s, t in self.tags.items()]}
        if name == "addShardToZone":
            self.tags[command["addShardToZone"]].add(command["zone"])
        elif name == "removeShardFromZone":
            self.tags[command["removeShardFromZone"]].discard(command["zone"])
        elif name == "updateZoneKeyRange":
            low, high = command["min"]["part"], command["max"]["part"]
            if command["zone"] is None:
                assert await ranges.delete_one({"min.part": low, "max.part": high}), "no such range"
                return {"ok": 1}
            async for other in ranges.find({}):
                if low < other["max"]["part"] and other["min"]["part"] < high:
                    raise OperationFailure("zone range overlaps an existing range", code=178)
            await ranges.insert_one(
                {
                    "ns": command["updateZoneKeyRange"],
                    "min": {"part": low},
                    "max": {"part": high},
                    "tag": command["zone"],
                }
            )
        return {"ok": 1}


async def test_sharding_again_after_a_shard_was_added_moves_the_zones() -> None:
    inner = mongomock_database()
    mongos = ZoningMongos(shards=2)
    database = Database(inner, {})
    database.client = mongos  # type: ignore[attr-defined]
    driver = MongoDriver(database, partitions=8, sharded=True, majority=False)
    await driver.setup()
    await driver.shard()
    mongos.tags["rs2"] = set()  # a third shard joins
    await driver.shard()
    ranges = [(d["min"]["part"], d["max"]["part"], d["tag"]) async for d in mongos.config["tags"].find({})]
    spread = sorted(ranges)
    assert spread == [
        (0, 2, "mscheduler_tasks-0-1"),
        (2, 5, "mscheduler_tasks-2-4"),
        (5, 8, "mscheduler_tasks-5-7"),
    ]
    assert mongos.tags == {
        "rs0": {"mscheduler_tasks-0-1"},
        "rs1": {"mscheduler_tasks-2-4"},
        "rs2": {"mscheduler_tasks-5-7"},
    }


# -- M3: an insert that met a write-concern error is made sure of before it is reported created ----


def wc_error(code: int, n: int) -> BulkWriteError:
    """What a server answers an insert of ``n`` documents it applied and could not confirm."""
    details = {
        "writeErrors": [],
        "writeConcernErrors": [{"code": code, "errmsg": f"write concern error {code}"}],
        "nInserted": n,
        "nUpserted": 0,
        "nMatched": 0,
        "nModified": 0,
        "nRemoved": 0,
        "upserted": [],
    }
    return BulkWriteError(details)


class SteppingDown:
    """The tasks collection, whose next ``insert_many`` is applied, answered with the write-
    concern error ``code`` and (``rolled_back``) undone, as a primary that stepped down before a
    majority had it and whose successor never had it."""

    def __init__(self, inner: Any, code: int, rolled_back: bool) -> None:
        self._inner = inner
        self.code = code
        self.rolled_back = rolled_back
        self.inserts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def insert_many(self, docs: list[dict[str, Any]], **kwargs: Any) -> Any:
        self.inserts += 1
        result = await self._inner.insert_many(docs, **kwargs)
        if self.inserts == 1:
            if self.rolled_back:
                await self._inner.delete_many({"_id": {"$in": [d["_id"] for d in docs]}})
            raise wc_error(self.code, len(docs))
        return result


@pytest.mark.parametrize("rolled_back", [True, False], ids=["rolled-back", "kept"])
@pytest.mark.parametrize("code", [91, 189, 11600, 11602])
async def test_an_insert_met_by_a_step_down_is_sent_again(code: int, rolled_back: bool) -> None:
    driver = MongoDriver(mongomock_database(), backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    stepping = SteppingDown(driver.tasks, code, rolled_back)
    driver.tasks = stepping
    publisher = Publisher(driver, clock=FakeClock(NOW))
    assert await publisher.send_many([Task("t1", "job"), Task("t2", "job")]) == [True, True]
    assert stepping.inserts == 2, "sent again: the write may have been rolled back"
    assert sorted(d["key"] for d in await driver.get_tasks(["t1", "t2"])) == ["t1", "t2"]
    assert await publisher.send(Task("t1", "job")) is False


async def replicated_driver() -> tuple[MongoDriver, Any]:
    from tests.scenarios.mongo_fakes import ReplicaSet

    rs = ReplicaSet()
    database = Database(mongomock_database(), {"mscheduler_tasks": rs.collection()})
    driver = MongoDriver(database, majority=False, backoff=0.0005, max_backoff=0.002, retries=2)
    await driver.setup()
    return driver, rs


async def test_an_insert_whose_majority_timed_out_is_created_once_a_majority_has_it() -> None:
    driver, rs = await replicated_driver()
    rs.collection().after["insert_many"] = lambda: (_ for _ in ()).throw(wc_error(64, 1))
    reads = rs.reads.copy()

    async def replicate_then_read() -> None:
        await rs.replicate()

    original = driver._confirmed

    async def confirmed(docs: Any, positions: Any) -> Any:
        await replicate_then_read()  # the majority catches up before the read
        return await original(docs, positions)

    driver._confirmed = confirmed  # type: ignore[method-assign]
    assert await Publisher(driver, clock=FakeClock(NOW)).send(Task("t1", "job")) is True
    assert rs.reads["primary/majority"] > reads["primary/majority"], "confirmed by a majority read"


async def test_an_insert_no_majority_confirms_is_not_reported_created() -> None:
    driver, rs = await replicated_driver()
    rs.collection().after["insert_many"] = lambda: (_ for _ in ()).throw(wc_error(64, 1))
    with pytest.raises(StorageError) as unknown:
        await Publisher(driver, clock=FakeClock(NOW)).send(Task("t1", "job"))
    assert unknown.value.transient and "majority" in str(unknown.value)
    assert rs.reads["primary/majority"] == 3, "read back at majority, with retries"


# -- M4: a reset of a finished task passes the change stream (it bumps ``wake``) ---------------------


async def test_a_reset_bumps_wake_so_the_stream_passes_it() -> None:
    """The stream's first stage passes updates that changed ``wake`` (``watch_pipeline``); the
    memory driver announces a reset (claimable again): so must the Mongo driver's write be
    (a consumer waiting on the stream hears it at once; tests/real/test_audit_3.py shows it)."""
    from mscheduler.drivers.mongo.common import WAKE

    driver = MongoDriver(mongomock_database())
    await driver.setup()
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await publisher.send(Task("t", "job"))
    assert len(await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))) == 1
    assert await driver.finish([FinishParams("t", "w1", "a1", NOW, "succeeded")]) == [True]
    before = (await driver.tasks.find_one({"_id": "t"})).get(WAKE, 0)
    assert await publisher.send(Task("t", "job"), reset_finished=True)
    after = await driver.tasks.find_one({"_id": "t"})
    assert after[WAKE] > before and after["state"]["claimers"] == ["job|*"]


# -- M5: a claim after an error: no second claimant, no second task for one attempt token ----------


async def test_a_claim_no_majority_confirms_is_released_not_run() -> None:
    """The claim is applied on the primary, its majority write times out (64) and the majority
    never has it (it may be rolled back, and another worker then claims the task): it is not run;
    its attempt is released at once (not counted), so the task is claimable again."""
    driver, rs = await replicated_driver()
    await Publisher(driver, clock=FakeClock(NOW)).send(Task("t1", "job"))
    await rs.replicate()
    rs.collection().after["find_one_and_update"] = lambda: (_ for _ in ()).throw(
        WriteConcernError("waiting for replication timed out", code=64, details={})
    )
    with pytest.raises(StorageError):
        await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    doc = await rs.primary.find_one({"key": "t1"})
    assert doc is not None and [(e["attempt"], e["status"]) for e in doc["state"]["worker_states"]] == [
        ("a1", "released")
    ]
    assert doc["state"]["fail_cnt"] == 0 and doc["state"]["status"] == "pending"
    again = await driver.claim(ClaimParams("w2", ["job"], NOW, ["b1"], LEASE))
    assert [c.key for c in again] == ["t1"], "claimable again at once"


class LandsLate:
    """The tasks collection, whose first ``find_one_and_update`` loses its connection and is
    applied only after the driver's recovery read looked (a write still in flight)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.pending: list[tuple[Any, Any, Any]] = []
        self.claims = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        if self.claims == 1:
            self.pending.append((args, kwargs, None))
            raise AutoReconnect("connection reset by peer")
        return await self._inner.find_one_and_update(*args, **kwargs)

    async def land(self) -> None:
        for args, kwargs, _ in self.pending:
            await self._inner.find_one_and_update(*args, **kwargs)


async def test_a_claim_whose_reply_was_lost_is_not_sent_again_with_its_token() -> None:
    driver = MongoDriver(mongomock_database(), backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    await Publisher(driver, clock=FakeClock(NOW)).send_many([Task("t1", "job"), Task("t2", "job")])
    late = LandsLate(driver.tasks)
    driver.tasks = late
    with pytest.raises(StorageError):
        await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    await late.land()
    holders = [doc["key"] async for doc in late._inner.find({"state.worker_states.attempt": "a1"})]
    assert holders == ["t1"], "one task holds the token: none taken by a second try"
    assert late.claims == 1


# -- L9: a control whose reply was lost is reported as done, not refused ---------------------------


class LosesReply:
    """The tasks collection: the next ``method`` is applied and its reply lost (a reset
    connection), as many times as asked."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.lose: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("find_one_and_update", "find_one_and_delete"):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            if self.lose.get(name):
                self.lose[name] -= 1
                raise AutoReconnect("connection reset by peer")
            return result

        return call


@pytest.mark.parametrize("action", ["cancel", "pause", "resume", "restart", "remove"])
async def test_a_control_whose_reply_was_lost_is_reported_done(action: str) -> None:
    driver = MongoDriver(mongomock_database(), backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    clock = FakeClock(NOW)
    ops = Operations(driver, clock=clock)
    await ops.send(Task("t", "job", option=TaskOption(max_unexpected_retries=0)), allow_unknown=True)
    if action == "resume":
        await ops.pause("t")
    if action == "restart":
        await ops.cancel("t")
    clock.advance(timedelta(seconds=1))
    losing = LosesReply(driver.tasks)
    driver.tasks = losing
    losing.lose = {"find_one_and_update": 1, "find_one_and_delete": 1}
    done = await getattr(ops, action)("t")
    if action == "remove":
        assert await driver.get_task("t") is None
        return
    assert {
        "cancel": done.status.value == "cancelled",
        "pause": done.paused,
        "resume": not done.paused,
        "restart": done.status.value == "pending",
    }[action]


# -- L3: a store of more than 200 partitions reads its wake-ups in bounded index ranges ----------------


async def test_wakeup_reads_stay_within_the_servers_merge_limit_past_200_partitions() -> None:
    """One index range per (partition, claimer token): a read of more than MAX_SCANS of them is
    sorted in memory by the server (``internalQueryMaxScansToExplode``), every poll."""
    from mscheduler.drivers.base import WakeupParams
    from mscheduler.drivers.mongo.common import MAX_SCANS

    driver = MongoDriver(mongomock_database(), partitions=300)
    await driver.setup()
    clock = FakeClock(NOW)
    keys = [f"t-{i}" for i in range(60)]
    await Publisher(driver, clock=clock).send_many(
        [Task(k, "job", option=TaskOption(run_at=NOW + timedelta(seconds=i))) for i, k in enumerate(keys)]
    )
    filters: list[dict[str, Any]] = []
    find = driver.tasks.find

    def recording(filter_: Any, *args: Any, **kwargs: Any) -> Any:
        filters.append(filter_)
        return find(filter_, *args, **kwargs)

    driver.tasks.find = recording
    wakeups = await driver.find_wakeups(WakeupParams("w1", ["job", "other"], NOW, 10))
    assert [w.key for w in wakeups if w.kind == "claim"] == keys[:10], "the earliest, merged"
    assert filters and all(
        len(f["part"]["$in"]) * len(f["state.claimers"]["$in"]) <= MAX_SCANS for f in filters
    )
    assert sorted(p for f in filters for p in f["part"]["$in"]) == list(range(300)), "each partition once"
