"""A sharded cluster (issue 18.9 / 18.11), when ``MSCHEDULER_TEST_MONGODB_URI`` is a mongos (the CI's
replica set is not: these skip there). ``mscheduler setup --partitions 4 --shards`` shards the
tasks by partition; a claim reaches one shard (explain: the shards its plan names)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler import MongoDriver, Publisher, Task
from mscheduler.cli.setup import setup_store
from mscheduler.domain.clock import SystemClock
from mscheduler.drivers.base import ClaimParams
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set"),
]


def shards_of(plan: dict[str, Any]) -> set[str]:
    """The shards a sharded write's plan reaches. A findAndModify on a partial shard key (the
    partition, without the ``_id``) is ``SINGLE_SHARD`` on 7.0 (SERVER-44422, in 5.0 / 6.0 / 7.0
    patch releases since mid-2023); from 7.1 it runs as a write without the full shard key,
    ``SHARD_WRITE`` over a query phase (``inputStage.winningPlan``), each phase targeted by the
    query's shard key range: one shard for one partition."""
    shards = {s["shardName"] for s in plan.get("shards", [])}
    inner = plan.get("inputStage", {}).get("winningPlan")
    return shards | shards_of(inner) if inner else shards


async def _is_mongos(database: Any) -> bool:
    hello = await database.command("hello")
    return bool(hello.get("msg") == "isdbgrid")


async def test_a_claim_on_a_sharded_store_reaches_one_shard(real_database: Any) -> None:
    if not await _is_mongos(real_database):
        pytest.skip("not a mongos: a sharded cluster is needed")
    _, notes = await setup_store(real_database, partitions=4, shards=True)
    assert "partitions: 4 (sharded)" in notes
    driver = MongoDriver(real_database)
    await driver.prepare()
    await Publisher(driver).send_many([Task(f"t{i}", "job") for i in range(40)])
    now = SystemClock().now()
    for part in range(4):
        filter_ = driver._claim_filter(ClaimParams("w1", ["job"], now, ["a"]), part=part)
        command = {
            "findAndModify": driver.tasks.name,
            "query": filter_,
            "sort": {"option.priority": -1, "state.targeted": -1, "state.claim_at": 1},
            "update": {"$set": {"x": 1}},
        }
        reply = await real_database.command({"explain": command, "verbosity": "queryPlanner"})
        plan = reply["queryPlanner"]["winningPlan"]
        assert len(shards_of(plan)) == 1, f"partition {part}: {plan['stage']} on {shards_of(plan)}"
    claimed = await driver.claim(
        ClaimParams("w1", ["job"], now, [f"a{i}" for i in range(40)], timedelta(seconds=30))
    )
    assert len(claimed) == 40
