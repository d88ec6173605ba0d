"""The third audit's findings (issue 24) where only a server can show them: the paths the fakes
of tests/scenarios/test_mongo_audit_3.py stand in for. On the CI's replica set: a send met by a
stepped-down or timed-out write concern (the server's ``failCommand`` fail point, which applies the
write and then answers the error: M3), the change stream's report of a pipeline update (L4), a
reset heard by a consumer without a poll (M4), the reads by key on their index (L6). On a mongos
(the CI's sharded job: ``MSCHEDULER_TEST_MONGODB_URI`` names a mongos): a transactional send on a
sharded store (H2), every single-task write on one shard and ``prepare()``'s check of the mongos
(M2). What needs the other kind of deployment skips, saying so."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler import Consumer, FakeClock, MongoDriver, Operations, Publisher, Task, TaskOption
from mscheduler.cli.setup import setup_store
from mscheduler.domain.clock import SystemClock
from mscheduler.drivers.base import ChangeEvent, ClaimParams, ControlParams, FinishParams
from tests.conftest import REAL_URI
from tests.real.test_audit_2 import driver_with_app, fail_command
from tests.real.test_sharding import _is_mongos, shards_of

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
]

LEASE = timedelta(seconds=30)


async def _on_mongos(database: Any) -> None:
    if not await _is_mongos(database):
        pytest.skip("not a mongos: the CI's sharded job runs this")


async def _not_on_mongos(database: Any) -> None:
    if await _is_mongos(database):
        pytest.skip("a replica set's fail points: the CI's replica-set jobs run this")


# -- M3: a send met by a write-concern error ---------------------------------------------------------


@pytest.mark.parametrize("code", [91, 189, 11600, 11602])
async def test_a_send_met_by_a_stepped_down_write_concern_is_sent_again(
    real_database: Any, code: int
) -> None:
    """The fail point applies the insert, then answers the write-concern error a primary that
    stepped down would: the driver sends it again (a duplicate key then: the first insert kept),
    and reports the task created, stored once."""
    await _not_on_mongos(real_database)
    app = f"audit3-{uuid.uuid4().hex[:6]}"
    driver = await driver_with_app(real_database, app)
    try:
        data = {"failCommands": ["insert"], "writeConcernError": {"code": code, "errmsg": "stepped down"}}
        async with fail_command(real_database, app, data):
            created = await Publisher(driver).send_many([Task("t1", "job"), Task("t2", "job")])
        assert created == [True, True]
        assert await driver.tasks.count_documents({"key": {"$in": ["t1", "t2"]}}) == 2
    finally:
        await driver.database.client.close()


async def test_a_send_whose_majority_timed_out_is_confirmed_by_a_majority_read(real_database: Any) -> None:
    await _not_on_mongos(real_database)
    app = f"audit3-{uuid.uuid4().hex[:6]}"
    driver = await driver_with_app(real_database, app)
    try:
        data = {"failCommands": ["insert"], "writeConcernError": {"code": 64, "errmsg": "wtimeout"}}
        async with fail_command(real_database, app, data):
            assert await Publisher(driver).send(Task("t1", "job")) is True
        assert await driver.tasks_majority.find_one({"_id": "t1"}) is not None
    finally:
        await driver.database.client.close()


# -- L4 / M4: what the server's change stream reports, and a reset heard at once -----------------


async def _events_of(driver: MongoDriver, write: Callable[[], Awaitable[Any]], key: str) -> list[ChangeEvent]:
    """The tasks' change events for ``key`` that ``write`` causes (the stream opened first)."""
    subscription = driver.watch(["job"])
    seen: list[ChangeEvent] = []

    async def collect() -> None:
        async for item in subscription:
            if isinstance(item, ChangeEvent) and item.key == key:
                seen.append(item)
                return

    reader = asyncio.create_task(collect())
    await asyncio.sleep(0.5)  # the stream is open
    await write()
    try:
        await asyncio.wait_for(reader, 10)
    except TimeoutError:
        pass
    finally:
        await subscription.aclose()
    return seen


async def test_the_stream_reads_claimers_from_every_kind_of_wake(real_database: Any) -> None:
    """A restart (a pipeline update that changes most of ``state``), a reset and a retry: each
    event says who may claim the task (claimers), whichever way the server reported the update
    (dotted fields, or a whole ``state``)."""
    await _not_on_mongos(real_database)
    driver = MongoDriver(real_database)
    await driver.setup()
    now = SystemClock().now()
    publisher = Publisher(driver)
    ops = Operations(driver)
    await publisher.send_many(
        [
            Task(k, "job", option=TaskOption(max_unexpected_retries=1, retry_delay=timedelta(0)))
            for k in ("r", "s", "f")
        ]
    )
    claimed = {
        c.key: c for c in await driver.claim(ClaimParams("w1", ["job"], now, ["a1", "a2", "a3"], LEASE))
    }
    error = {"type": "E", "message": "m", "traceback": None}
    await driver.finish([FinishParams("s", "w1", claimed["s"].attempt, now, "succeeded")])
    await driver.finish(
        [FinishParams("r", "w1", claimed["r"].attempt, now, "failed", None, error, None, True)]
    )

    restart = await _events_of(driver, lambda: ops.restart("r"), "r")
    reset = await _events_of(driver, lambda: publisher.send(Task("s", "job"), reset_finished=True), "s")
    retry = await _events_of(
        driver,
        lambda: driver.finish(
            [FinishParams("f", "w1", claimed["f"].attempt, now, "failed", None, error, now)]
        ),
        "f",
    )
    for what, events in (("restart", restart), ("reset", reset), ("retry", retry)):
        assert events and events[0].claimers == ("job|*",), f"{what}: {events}"


async def test_a_reset_wakes_a_consumer_without_a_poll(real_database: Any) -> None:
    await _not_on_mongos(real_database)
    driver = MongoDriver(real_database)
    await driver.setup()
    ran: list[str] = []
    done = asyncio.Event()

    async def job(params: Any) -> None:
        ran.append("job")
        done.set()

    consumer = Consumer(driver, poll_interval=3600.0, stream_poll_interval=3600.0, planner=False)
    consumer.register("job", job)
    publisher = Publisher(driver)
    await publisher.send(Task("t", "job"))
    async with consumer:
        await asyncio.wait_for(done.wait(), 10)
        done.clear()
        for _ in range(100):
            if (await driver.get_task("t") or {}).get("state", {}).get("status") == "succeeded":
                break
            await asyncio.sleep(0.05)
        assert await publisher.send(Task("t", "job"), reset_finished=True)
        await asyncio.wait_for(done.wait(), 10)  # an hour's poll interval: the stream woke it
    assert ran == ["job", "job"]


# -- H2 / M2: a sharded store --------------------------------------------------------------------


async def test_a_transactional_send_on_a_sharded_store(real_database: Any) -> None:
    await _on_mongos(real_database)
    await setup_store(real_database, partitions=4, shards=True)
    driver = MongoDriver(real_database)
    await driver.prepare()  # the mongos routes claims by partition (SERVER-44422), or this refuses
    publisher = Publisher(driver)
    client = real_database.client
    keys = [f"tx-{i}" for i in range(8)]  # in every partition of 4

    async def work(session: Any) -> list[bool]:
        return await publisher.send_many([Task(k, "job") for k in keys], session=session)

    async with client.start_session() as session:
        assert await session.with_transaction(work) == [True] * 8
    async with client.start_session() as session:
        assert await session.with_transaction(work) == [False] * 8, "idempotent by key"
    assert await driver.tasks.count_documents({"key": {"$in": keys}}) == 8


async def test_every_single_task_write_reaches_one_shard(real_database: Any) -> None:
    """The cancel's findAndModify and a finish's update name the task's whole shard key: each
    explained on the mongos reaches one shard."""
    await _on_mongos(real_database)
    await setup_store(real_database, partitions=4, shards=True)
    driver = MongoDriver(real_database)
    await driver.prepare()
    now = datetime.now(UTC)
    await Publisher(driver, clock=FakeClock(now)).send_many([Task(f"t{i}", "job") for i in range(8)])
    for i in range(8):
        key = f"t{i}"
        control = ControlParams(key, "cancel", ("pending",), now)
        filter_ = {"_id": key, "part": driver._part(key), "state.status": {"$in": list(control.statuses)}}
        command = {"findAndModify": driver.tasks.name, "query": filter_, "update": {"$set": {"x": 1}}}
        reply = await real_database.command({"explain": command, "verbosity": "queryPlanner"})
        assert len(shards_of(reply["queryPlanner"]["winningPlan"])) == 1, key
        assert (await Operations(driver).cancel(key)).status.value == "cancelled"
