"""Every claim and every write the Mongo driver sends about tasks targets one partition (issue 18.9):
on a sharded cluster (shard key ``{part: 1, _id: 1}``, partitions placed by zones) one shard.

A checking collection sits where the tasks collection is: for each write command (findAndModify,
update, delete, insert, each operation of a bulk write) it works out which partitions the
command's filter (or documents) can reach, as mongos would from the shard key, and records any
command that could reach more than one. A whole fleet runs on a store of 4 partitions (mongomock
underneath): publishing, claims, pings with checkpoints, finishes, failures and retries, lost
leases, deadlines, operators' controls and edits, a family of children, retention. Reads may
reach every shard (a listing, the poll) and are not checked.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mscheduler import (
    Consumer,
    FakeClock,
    MongoDriver,
    Operations,
    OptionChange,
    Publisher,
    Retention,
    RetentionService,
    Task,
    TaskOption,
)
from mscheduler.domain.partitions import part_of
from mscheduler.drivers.base import ExpireParams
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.harness import advance_until
from tests.scenarios.mongo_fakes import Database

PARTITIONS = 4


def reachable(filter_: Any, partitions: int) -> set[int]:
    """The partitions a filter may match, from its conditions on ``part`` (all when none)."""
    if not isinstance(filter_, dict):
        return set(range(partitions))
    found: set[int] | None = None
    condition = filter_.get("part")
    if isinstance(condition, int):
        found = {condition}
    elif (
        isinstance(condition, dict) and isinstance(condition.get("$in"), list) and "$exists" not in condition
    ):
        found = set(condition["$in"])
    for clause in filter_.get("$and", []):
        inner = reachable(clause, partitions)
        found = inner if found is None else found & inner
    return found if found is not None else set(range(partitions))


class CheckingCollection:
    """The tasks collection, recording every write command that could reach several partitions."""

    WRITES = ("find_one_and_update", "find_one_and_delete", "update_one", "update_many", "delete_many")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.checking = False
        self.stray: list[tuple[str, Any]] = []
        self.writes = 0

    def _check(self, what: str, parts: set[int], detail: Any) -> None:
        if self.checking:
            self.writes += 1
            if len(parts) != 1:
                self.stray.append((what, detail))

    async def insert_many(self, docs: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        self._check("insert_many", {doc["part"] for doc in docs}, [doc["key"] for doc in docs])
        return await self._inner.insert_many(docs, *args, **kwargs)

    async def bulk_write(self, ops: list[Any], *args: Any, **kwargs: Any) -> Any:
        parts = set().union(*(reachable(op._filter, PARTITIONS) for op in ops))
        self._check("bulk_write", parts, [op._filter for op in ops])
        return await self._inner.bulk_write(ops, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.WRITES:
            return attr

        async def write(filter_: Any, *args: Any, **kwargs: Any) -> Any:
            self._check(name, reachable(filter_, PARTITIONS), filter_)
            return await attr(filter_, *args, **kwargs)

        return write


async def test_every_claim_and_every_write_about_tasks_reaches_one_partition(fake_clock: FakeClock) -> None:
    inner = mongomock_database()
    tasks = CheckingCollection(inner["mscheduler_tasks"])
    driver = MongoDriver(Database(inner, {"mscheduler_tasks": tasks}), majority=False, partitions=PARTITIONS)
    await driver.setup()
    tasks.checking = True
    publisher = Publisher(driver, clock=fake_clock)
    ops = Operations(driver, clock=fake_clock)
    short = TaskOption(
        ping_interval=timedelta(seconds=1),
        worker_timeout=timedelta(seconds=3),
        retry_delay=timedelta(seconds=1),
    )
    await publisher.send_many([Task(f"t{i}", "job", {"i": i}, option=short) for i in range(60)])
    soon = TaskOption(deadline=fake_clock.now() + timedelta(seconds=2))
    await publisher.send_many([Task(f"late{i}", "job", option=soon) for i in range(5)])
    await publisher.send(Task("etl", "etl", children=["fetch", "load"]))
    await publisher.send_many([Task(f"op{i}", "idle") for i in range(4)])
    failures: dict[str, int] = {}

    consumers = [
        Consumer(driver, worker_id=f"w{i}", clock=fake_clock, poll_interval=0.5, concurrency=8, planner=False)
        for i in range(3)
    ]
    for consumer in consumers:

        @consumer.handler("job")
        async def job(params: dict[str, Any], ctx: Any) -> int:
            await ctx.checkpoint({"seen": params["i"]})
            if params["i"] % 7 == 0 and failures.setdefault(str(params["i"]), 0) < 1:
                failures[str(params["i"])] += 1
                raise RuntimeError("a first failure")
            return int(params["i"])

        @consumer.handler("fetch")
        async def fetch(params: Any) -> None:
            return None

        @consumer.handler("load")
        async def load(params: Any) -> None:
            return None

    fake_clock.advance(timedelta(seconds=3))  # the late tasks' deadline passes before anyone runs
    for consumer in consumers:
        await consumer.start()
    try:
        await ops.cancel("op0")
        await ops.pause("op1")
        await ops.resume("op1")
        await ops.edit("op2", OptionChange(priority=5))
        await ops.remove("op3")

        async def all_done() -> bool:
            counts = await driver.count_by_status()
            return counts.get("succeeded", 0) >= 60 + 3  # the jobs and the family (parent + 2 children)

        await advance_until(fake_clock, all_done, step=0.5, limit=400)
        await ops.restart("op0")
        await driver.expire_leases(ExpireParams(fake_clock.now()))
    finally:
        for consumer in consumers:
            await consumer.stop()
    fake_clock.advance(timedelta(days=2))
    removed = await RetentionService(
        driver, Retention(succeeded=timedelta(days=1)), clock=fake_clock
    ).run_once()
    assert removed >= 60
    assert tasks.writes > 100
    assert tasks.stray == [], f"{len(tasks.stray)} writes could reach several shards: {tasks.stray[:3]}"
    counts = await driver.count_by_status()
    assert counts.get("expired") == 5 and counts.get("pending", 0) >= 1


def test_the_partition_of_a_key_is_stable() -> None:
    """A key's partition never changes (a document cannot move between partitions)."""
    assert [part_of(f"k{i}", 8) for i in range(10)] == [part_of(f"k{i}", 8) for i in range(10)]
    assert {part_of(f"k{i}", 8) for i in range(200)} == set(range(8))
