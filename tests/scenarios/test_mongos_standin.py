"""The mongos stand-in (``mscheduler.testing.mongos``): each rule it keeps for a sharded collection,
with the server's code, on a store set up and sharded by ``MongoDriver`` as on a cluster; and the
writes it refuses that the Mongo driver sent on a sharded store (the transactional upsert without
the full shard key; a task placed in a partition that is not its key's).

The conformance suite runs on it too (``sharded-p4``): every write a prepared driver sends there
is routed as a mongos routes it.
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import DeleteOne, InsertOne, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure, WriteError

from mscheduler import FakeClock, MongoDriver, Operations, Publisher, Task
from mscheduler.domain.exceptions import MSchedulerError, StorageError
from mscheduler.domain.model import TaskStatus
from mscheduler.domain.partitions import part_of
from mscheduler.drivers.base import InsertParams, NewTask
from mscheduler.drivers.mongo.common import SHARD_KEY_INDEX
from mscheduler.testing.mongos import MisplacedTask, mongos_database

PARTITIONS = 4


def key_in(part: int, start: int = 0) -> str:
    """A task key whose partition is ``part`` (of ``PARTITIONS``)."""
    return next(f"k{i}" for i in range(start, start + 1000) if part_of(f"k{i}", PARTITIONS) == part)


async def sharded_store(**options: Any) -> tuple[MongoDriver, Any]:
    """A 4-partition store set up and sharded over 2 shards (partitions 0-1 on the first, 2-3 on
    the second), and its raw tasks collection."""
    database = mongos_database(**options)
    driver = MongoDriver(database, partitions=PARTITIONS, sharded=True)
    await driver.setup()
    sent = await driver.shard()
    assert [next(iter(c)) for c in sent].count("updateZoneKeyRange") == 2
    return driver, database["mscheduler_tasks"]


async def one_task(driver: MongoDriver, key: str) -> None:
    assert await Publisher(driver, clock=FakeClock()).send(Task(key, "job"))


# -- the rules ---------------------------------------------------------------------------------------


async def test_an_unsharded_collection_takes_any_write() -> None:
    database = mongos_database()
    raw = database["plain"]
    await raw.insert_one({"_id": 1, "a": 1})
    await raw.update_one({"a": 1}, {"$set": {"b": 1}})
    await raw.find_one_and_update({"a": 1}, {"$set": {"c": 1}}, upsert=True)
    await raw.delete_one({"a": 1})
    assert await raw.count_documents({}) == 0


async def test_a_single_update_needs_the_id_or_one_shard() -> None:
    driver, raw = await sharded_store()
    key = key_in(2)
    await one_task(driver, key)
    with pytest.raises(
        WriteError, match=r"must contain an exact match on _id .* targeted 2 shards"
    ) as caught:
        await raw.update_one({"key": key}, {"$set": {"x": 1}})
    assert caught.value.code == 72
    await raw.update_one({"_id": key}, {"$set": {"x": 1}})  # an exact _id: sent to every shard
    await raw.update_one({"key": key, "part": 2}, {"$set": {"x": 2}})  # one shard by the prefix
    await raw.update_many({"key": key}, {"$set": {"x": 3}})  # a multi-update may reach all
    assert (await raw.find_one({"_id": key}))["x"] == 3


async def test_a_find_and_modify_needs_one_shard() -> None:
    driver, raw = await sharded_store()
    key = key_in(1)
    await one_task(driver, key)
    with pytest.raises(OperationFailure, match="findAndModify must contain the shard key") as caught:
        await raw.find_one_and_update({"key": key}, {"$set": {"x": 1}})
    assert caught.value.code == 61
    with pytest.raises(OperationFailure, match="findAndModify must contain the shard key"):
        await raw.find_one_and_update({"_id": key}, {"$set": {"x": 1}})  # _id is not the shard key
    with pytest.raises(OperationFailure, match="findAndModify must contain the shard key"):
        await raw.find_one_and_update({"key": key, "part": {"$in": [1, 2]}}, {"$set": {"x": 1}})
    # partitions 0 and 1 live on one shard: a findAndModify naming either reaches one shard
    assert await raw.find_one_and_update({"key": key, "part": {"$in": [0, 1]}}, {"$set": {"x": 1}})
    assert await raw.find_one_and_update({"key": key, "part": 1}, {"$set": {"x": 2}})
    assert await raw.find_one_and_delete({"_id": key, "part": 1})


async def test_a_single_delete_needs_the_id_or_one_shard() -> None:
    driver, raw = await sharded_store()
    await one_task(driver, key_in(3))
    with pytest.raises(WriteError, match="A single delete on a sharded collection") as caught:
        await raw.delete_one({"key": key_in(3)})
    assert caught.value.code == 61
    assert (await raw.delete_one({"_id": key_in(3)})).deleted_count == 1


async def test_an_upsert_needs_the_full_shard_key() -> None:
    _, raw = await sharded_store()
    key = key_in(0)
    doc = {"_id": key, "key": key, "part": 0}
    with pytest.raises(WriteError, match="could not extract exact shard key") as caught:
        await raw.update_one({"key": key, "part": 0}, {"$setOnInsert": doc}, upsert=True)
    assert caught.value.code == 61
    with pytest.raises(OperationFailure, match="could not extract exact shard key"):
        await raw.find_one_and_update({"_id": key}, {"$setOnInsert": doc}, upsert=True)
    assert await raw.count_documents({}) == 0, "nothing was written"
    await raw.update_one({"_id": key, "part": 0}, {"$setOnInsert": doc}, upsert=True)
    assert await raw.find_one({"_id": key}) == doc


async def test_a_shard_key_value_changes_only_by_the_full_key_on_one_document() -> None:
    database = mongos_database()
    raw = database["things"]
    await raw.insert_many([{"_id": i, "part": 0} for i in range(3)] + [{"_id": 9}])
    with pytest.raises(OperationFailure, match="create an index that starts with the proposed shard key"):
        await database.client.admin.command(
            {"shardCollection": f"{database.name}.things", "key": {"part": 1, "_id": 1}}
        )
    await raw.create_index([("part", 1), ("_id", 1)])
    await database.client.admin.command(
        {"shardCollection": f"{database.name}.things", "key": {"part": 1, "_id": 1}}
    )
    with pytest.raises(WriteError, match="without specifying the full shard key") as by_id:
        await raw.update_one({"_id": 0}, {"$set": {"part": 1}})
    assert by_id.value.code == 31025
    with pytest.raises(WriteError, match="Multi-update operations are not allowed") as multi:
        await raw.update_many({"_id": 1, "part": 0}, {"$set": {"part": 1}})
    assert multi.value.code == 72
    # setting a missing shard-key field is a change of its value
    with pytest.raises(WriteError, match="without specifying the full shard key"):
        await raw.update_many({"part": {"$exists": False}}, {"$set": {"part": 0}})
    assert [d.get("part") async for d in raw.find({}, sort=[("_id", 1)])] == [0, 0, 0, None], "put back"
    await raw.update_one({"_id": 2, "part": 0}, {"$set": {"part": 1}})  # the full key, one document
    assert (await raw.find_one({"_id": 2}))["part"] == 1
    with pytest.raises(WriteError) as immutable:
        await raw.update_one({"_id": 2, "part": 1}, [{"$set": {"_id": 3}}])
    assert "_id" in str(immutable.value)


async def test_a_bulk_write_reports_each_refused_operation() -> None:
    driver, raw = await sharded_store()
    first, second = key_in(0), key_in(2)
    await one_task(driver, first)
    ops = [
        UpdateOne({"key": first}, {"$set": {"x": 1}}),  # refused: 2 shards
        UpdateOne({"_id": first}, {"$set": {"x": 2}}),
        DeleteOne({"key": first}),  # refused
        InsertOne({"_id": second, "key": second, "part": 2}),
        UpdateMany({"part": 0}, {"$set": {"y": 1}}),
    ]
    with pytest.raises(BulkWriteError) as caught:
        await raw.bulk_write(ops, ordered=False)
    assert [(e["index"], e["code"]) for e in caught.value.details["writeErrors"]] == [(0, 72), (2, 61)]
    assert (await raw.find_one({"_id": first}))["x"] == 2
    assert await raw.count_documents({}) == 2


async def test_a_hint_must_name_an_index() -> None:
    driver, raw = await sharded_store()
    await one_task(driver, key_in(1))
    await raw.update_one({"_id": key_in(1)}, {"$set": {"x": 1}}, hint=SHARD_KEY_INDEX)
    with pytest.raises(WriteError, match="hint provided does not correspond to an existing index") as caught:
        await raw.update_one({"_id": key_in(1)}, {"$set": {"x": 1}}, hint="claim")
    assert caught.value.code == 2


async def test_shard_key_values_are_not_arrays_and_unique_indexes_are_prefixed_by_the_key() -> None:
    _, raw = await sharded_store()
    with pytest.raises(WriteError, match="Shard key cannot contain array values"):
        await raw.insert_one({"_id": "x", "part": [1, 2]})
    with pytest.raises(OperationFailure, match="cannot create unique index over") as index:
        await raw.create_index("key", name="key_unique", unique=True)
    assert index.value.code == 67
    await raw.create_index([("part", 1), ("_id", 1), ("key", 1)], name="prefixed", unique=True)


async def test_a_store_set_up_unsharded_cannot_be_sharded() -> None:
    """Its unique ``key`` index is not prefixed by the shard key: ``shardCollection`` refuses."""
    database = mongos_database()
    driver = MongoDriver(database, partitions=PARTITIONS)
    await driver.setup()
    driver.sharded = True
    with pytest.raises(OperationFailure, match="Uniqueness can't be maintained") as caught:
        await driver.shard()
    assert caught.value.code == 72


async def test_older_servers_need_the_full_shard_key_for_one_document() -> None:
    """Without targeting by a shard-key prefix (patch releases before mid-2023), a findAndModify
    and a single update need the full shard key (or, for the update, ``_id``)."""
    driver, raw = await sharded_store(prefix_targeting=False)
    key = key_in(2)
    await one_task(driver, key)
    with pytest.raises(OperationFailure, match="findAndModify must contain the shard key"):
        await raw.find_one_and_update({"key": key, "part": 2}, {"$set": {"x": 1}})
    with pytest.raises(WriteError, match="A single update on a sharded collection") as caught:
        await raw.update_one({"key": key, "part": 2}, {"$set": {"x": 1}})
    assert caught.value.code == 61
    assert await raw.find_one_and_update({"_id": key, "part": 2}, {"$set": {"x": 1}})
    await raw.update_one({"_id": key}, {"$set": {"x": 2}})


# -- what the Mongo driver sent ---------------------------------------------------------------------


async def test_the_transactional_upsert_by_key_and_partition_is_refused() -> None:
    """``send(..., session=s)`` upserted each task filtered by ``{key, part}``, its ``_id`` only in
    ``$setOnInsert``: on a sharded collection an upsert names the full shard key ``{part, _id}``,
    so mongos refuses it (61). The stand-in refuses it; by ``{_id, part}`` it goes through."""
    _, raw = await sharded_store()
    key = key_in(3)
    doc = {"_id": key, "key": key, "part": 3, "name": "job"}
    with pytest.raises(BulkWriteError) as caught:
        await raw.bulk_write([UpdateOne({"key": key, "part": 3}, {"$setOnInsert": doc}, upsert=True)])
    (error,) = caught.value.details["writeErrors"]
    assert error["code"] == 61 and "could not extract exact shard key" in error["errmsg"]
    result = await raw.bulk_write([UpdateOne({"_id": key, "part": 3}, {"$setOnInsert": doc}, upsert=True)])
    assert result.upserted_ids == {0: key}


async def test_a_task_placed_in_another_partition_than_its_keys_is_refused() -> None:
    """A driver that never read the store's layout took it for one partition and inserted every
    task with ``part`` 0: on a sharded store such a document sits on the wrong shard. The stand-in
    refuses it, naming the partition it belongs to."""
    driver, raw = await sharded_store()
    key = key_in(2)
    refused = f"placed in partition 0, but its key belongs to partition 2 of the store's {PARTITIONS}"
    with pytest.raises(MisplacedTask, match=refused):
        await raw.insert_one({"_id": key, "key": key, "part": 0})
    with pytest.raises(BulkWriteError) as bulk:
        await raw.insert_many([{"_id": key, "key": key, "part": 0}], ordered=False)
    assert "belongs to partition 2" in bulk.value.details["writeErrors"][0]["errmsg"]
    # moved to another partition by the full key: refused as well, and put back
    await one_task(driver, key)
    with pytest.raises(MisplacedTask):
        await raw.update_one({"_id": key, "part": 2}, {"$set": {"part": 3}})
    assert (await raw.find_one({"_id": key}))["part"] == 2


# The same writes through the driver: they fail until the driver reads the store's layout before
# acting on it (H1) and upserts by the full shard key in a transaction (H2), both outside this
# module's area; the stand-in is what makes them fail (on plain mongomock the first two pass).


@pytest.mark.xfail(strict=True, raises=StorageError, reason="H1: a driver writes with a layout it never read")
async def test_a_driver_that_never_read_the_layout_places_a_task_in_its_partition() -> None:
    _, raw = await sharded_store()
    key = key_in(2)
    cold = MongoDriver(raw.database)  # as the CLI builds one: never prepared
    now = FakeClock().now()
    task = NewTask(key, "job", None, Task(key, "job").option.to_storage(now))
    assert await cold.insert_tasks(InsertParams([task], now)) == [True]
    assert (await raw.find_one({"_id": key}))["part"] == 2


@pytest.mark.xfail(
    strict=True,
    raises=(AssertionError, MSchedulerError),
    reason="H1: a driver acts on a layout it never read",
)
async def test_a_driver_that_never_read_the_layout_cancels_tasks_of_every_partition() -> None:
    driver, raw = await sharded_store()
    keys = [key_in(p, start=100 * p) for p in range(PARTITIONS)]
    for key in keys:
        await one_task(driver, key)
    ops = Operations(MongoDriver(raw.database), clock=FakeClock())  # as the CLI builds it
    for key in keys:
        assert (await ops.cancel(key)).status is TaskStatus.CANCELLED, key


class _Session:
    """Stands in for a ClientSession (mongomock has none): the driver passes it on."""


class _WithoutSession:
    """The tasks collection, taking the ``session`` the driver passes (and dropping it)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sessions: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if "session" in kwargs:
                self.sessions.append(kwargs.pop("session"))
            return attr(*args, **kwargs)

        return call


@pytest.mark.xfail(
    strict=True, raises=BulkWriteError, reason="H2: the transactional upsert lacks the full shard key"
)
async def test_a_send_in_a_transaction_on_a_sharded_store_creates_the_task() -> None:
    driver, raw = await sharded_store()
    tasks = _WithoutSession(driver.tasks)
    driver.tasks = driver.tasks_primary = tasks
    key = key_in(1)
    assert await Publisher(driver, clock=FakeClock()).send(Task(key, "job"), session=_Session())
    assert tasks.sessions, "written in the caller's session"
    assert (await raw.find_one({"_id": key}))["part"] == 1
