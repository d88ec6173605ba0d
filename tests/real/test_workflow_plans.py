"""Query plans of the workflow operations on a real server (``explain``): a map step fanned out
into 3,000 items beside 2,000 plain tasks. The statuses among its items are a DISTINCT_SCAN of
``family`` (a key per status, whatever the item count); the join's read of the items' results
reads only the succeeded items, in order, without an in-memory sort; the fan-out's record and a
reset find their steps by key; counting its items by status reads index keys only."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient

from mscheduler import Child, FakeClock, MongoDriver, Publisher, Task
from mscheduler.domain.model import item_key
from mscheduler.drivers.base import (
    ClaimParams,
    ExpandMapParams,
    FinishParams,
    InsertParams,
    NewTask,
    ResetStepsParams,
    SyncParentsParams,
)
from mscheduler.drivers.mongo.common import FAMILY_INDEX, KEY_INDEX
from tests.conftest import REAL_URI
from tests.real.test_query_plans import (
    GENERIC_ARGUMENTS,
    IN_MEMORY_SORTS,
    CommandRecorder,
    Plan,
    assert_one_task,
    read_plan,
)

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
    pytest.mark.asyncio(loop_scope="module"),
]

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ITEMS = 3_000
SUCCEEDED = 40  # items finished before the reads are explained


class Setup:
    def __init__(self, database: Any, driver: MongoDriver, recorder: CommandRecorder) -> None:
        self.database, self.driver, self.recorder = database, driver, recorder

    async def commands_of(self, name: str, operation: Any) -> list[dict[str, Any]]:
        self.recorder.collection = self.driver.tasks.name
        self.recorder.commands.clear()
        try:
            await operation()
        finally:
            self.recorder.collection = None
        return [c for c in self.recorder.commands if next(iter(c)) == name]

    async def explain(self, command: dict[str, Any]) -> Plan:
        explained = {k: v for k, v in command.items() if k not in GENERIC_ARGUMENTS}
        reply = await self.database.command({"explain": explained, "verbosity": "executionStats"})
        return read_plan(reply)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup() -> AsyncIterator[Setup]:
    recorder = CommandRecorder()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(REAL_URI, event_listeners=[recorder])
    database = client[f"mscheduler_wf_{uuid.uuid4().hex[:8]}"]
    try:
        driver = MongoDriver(database)
        await driver.setup()
        publisher = Publisher(driver, clock=FakeClock(T0))
        await publisher.send_many([Task(f"plain-{i:05}", "alpha") for i in range(2_000)])
        children = [Child("list"), Child("square", map_over="list"), Child("total", needs=["square"])]
        await publisher.send(Task("wf", "wf", children=children))
        option = (await driver.get_task("wf/square") or {})["option"]
        items = [
            NewTask(item_key("wf/square", i), "square", i, option, parent="wf/square", position=i)
            for i in range(ITEMS)
        ]
        for start in range(0, ITEMS, 1000):
            await driver.insert_tasks(InsertParams(items[start : start + 1000], T0))
        assert await driver.expand_map(ExpandMapParams("wf/square", ITEMS, "fail", T0))
        now = T0 + timedelta(seconds=1)
        claimed = await driver.claim(ClaimParams("w1", ["square"], now, [f"a{i}" for i in range(SUCCEEDED)]))
        await driver.finish(
            [FinishParams(c.key, "w1", c.attempt, now, "succeeded", c.params) for c in claimed]
        )
        yield Setup(database, driver, recorder)
    finally:
        await client.drop_database(database.name)
        await client.close()


async def test_a_map_steps_statuses_are_a_distinct_scan_of_the_family_index(setup: Setup) -> None:
    sync = SyncParentsParams(["wf/square"], T0 + timedelta(seconds=3))
    (command,) = await setup.commands_of("distinct", lambda: setup.driver.sync_parents(sync))
    plan = await setup.explain(command)
    assert "DISTINCT_SCAN" in plan.stages and plan.indexes == {FAMILY_INDEX}, plan.summary()
    assert plan.keys <= 10, f"a key per status, not per item: {plan.summary()}"
    assert plan.docs == 0 or plan.docs <= 10, plan.summary()


async def test_the_joins_read_reads_only_the_succeeded_items_in_order(setup: Setup) -> None:
    commands = await setup.commands_of("find", lambda: setup.driver.read_results(["wf/square"]))
    plan = await setup.explain(commands[-1])
    assert plan.indexes == {FAMILY_INDEX} and not IN_MEMORY_SORTS & set(plan.stages), plan.summary()
    assert plan.keys <= SUCCEEDED + 1 and plan.docs <= SUCCEEDED, plan.summary()
    assert_one_task(await setup.explain(commands[0]), {KEY_INDEX}, "the step itself")


async def test_a_fan_out_record_and_a_reset_find_their_steps_by_key(setup: Setup) -> None:
    now = T0 + timedelta(seconds=2)
    (update,) = await setup.commands_of(
        "update", lambda: setup.driver.expand_map(ExpandMapParams("wf/square", ITEMS, "fail", now))
    )
    assert_one_task(await setup.explain(update), {KEY_INDEX}, "expand_map")
    commands = await setup.commands_of(
        "delete", lambda: setup.driver.reset_steps(ResetStepsParams(["wf/total"], now))
    )
    assert commands == []  # no map step among them: no items to remove
    (reset,) = await setup.commands_of(
        "update", lambda: setup.driver.reset_steps(ResetStepsParams(["wf/total"], now))
    )
    assert_one_task(await setup.explain(reset), {KEY_INDEX}, "reset_steps")


async def test_counting_a_map_steps_items_reads_index_keys_only(setup: Setup) -> None:
    (command,) = await setup.commands_of("aggregate", lambda: setup.driver.count_items("wf/square"))
    plan = await setup.explain(command)
    assert plan.indexes == {FAMILY_INDEX} and plan.docs == 0, plan.summary()
    assert plan.keys <= ITEMS + 1, plan.summary()
