"""``mscheduler setup`` builds a store's indexes; workers check them and never build them (issue
18.8: ``createIndexes`` in a consumer's start waited for the commit quorum)."""

from __future__ import annotations

from typing import Any

import pytest

from mscheduler import Consumer, MongoDriver, Publisher, Task
from mscheduler.cli.setup import setup_store
from mscheduler.domain.exceptions import InvalidInput, StorageError
from mscheduler.domain.partitions import part_of
from mscheduler.drivers.mongo.indexes import existing_indexes
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.mongo_fakes import Database


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
    assert [n for n in notes if n.startswith("still missing")] == []
    assert dict(made)["mscheduler_tasks"].count(",") >= 10
    assert await Publisher(driver).send(Task("t", "job"))
    await consumer.start()
    await consumer.stop()
    again, notes = await setup_store(database)
    assert again == made and notes == ["partitions: 1"], "idempotent"


async def test_setup_fixes_the_partitions_and_every_process_reads_them() -> None:
    database = mongomock_database()
    _, notes = await setup_store(database, partitions=4)
    assert "partitions: 4" in notes
    reader = MongoDriver(database, create_indexes=False)
    await reader.prepare()
    assert reader.partitions == 4, "a process reads the store's partitions"
    with pytest.raises(StorageError) as refused:
        await MongoDriver(database, partitions=2, create_indexes=False).prepare()
    assert refused.value.config and "4 partitions" in str(refused.value)
    await Publisher(reader).send(Task("t", "job"))
    stored = await database["mscheduler_tasks"].find_one({"key": "t"})
    assert stored is not None and stored["part"] == part_of("t", 4)


class _Admin:
    def __init__(self, shards: int) -> None:
        self.sent: list[dict[str, object]] = []
        self.shards = shards

    async def command(self, command: dict[str, object]) -> dict[str, object]:
        if "listShards" in command:
            return {"shards": [{"_id": f"rs{i}"} for i in range(self.shards)]}
        self.sent.append(command)
        return {"ok": 1}


async def test_setup_with_shards_shards_the_tasks_by_partition_with_a_zone_per_shard() -> None:
    """18.11 (no cluster here: a mongos that records what it is told): shard key {part, _id}, a
    chunk boundary per partition, 8 partitions over 3 shards in contiguous zones, unique indexes
    that a sharded collection cannot have made plain; uniqueness by params refused there."""
    inner = mongomock_database()
    admin = _Admin(shards=3)
    database = Database(inner, {})
    config = {"config": mongomock_database("config")}  # no zone ranges yet (config.tags)

    async def command(command: Any, *args: Any, **kwargs: Any) -> Any:  # a mongos of today
        return (
            {"version": "8.0.4"} if command == "buildInfo" else await inner.command(command, *args, **kwargs)
        )

    database.command = command  # type: ignore[attr-defined]
    database.client = type("Client", (), {"admin": admin, "__getitem__": lambda _, n: config[n]})()  # type: ignore[attr-defined]
    _, notes = await setup_store(database, partitions=8, shards=True, majority=False)
    names = [next(iter(c)) for c in admin.sent]
    assert names[0] == "shardCollection" and admin.sent[0]["key"] == {"part": 1, "_id": 1}
    assert names.count("split") == 7
    ranges = [(c["min"]["part"], c["max"]["part"]) for c in admin.sent if "updateZoneKeyRange" in c]  # type: ignore[index]
    assert ranges == [(0, 2), (2, 5), (5, 8)], "contiguous partitions per shard, all covered"
    indexes = await existing_indexes(inner["mscheduler_tasks"])
    assert (
        "shard_key" in indexes
        and not indexes["key"].get("unique")
        and not indexes["unique_live"].get("unique")
    )
    assert "partitions: 8 (sharded)" in notes
    driver = MongoDriver(database, create_indexes=False, majority=False)
    await driver.prepare()
    assert driver.sharded and driver.partitions == 8
    with pytest.raises(InvalidInput, match="sharded"):
        await Publisher(driver).send(Task("u", "job", {"n": 1}, unique_by="params"))
    assert await Publisher(driver).send(Task("t", "job"))
