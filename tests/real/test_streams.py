"""One change stream per process, led by a $match the server pushes down (issue 18.6), on a real
replica set: the oplog scan's own filter holds the stream's predicate, so a ping builds no event;
a process's watchers share one server cursor."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import MongoDriver, Publisher, Task, TaskOption
from mscheduler.domain.clock import SystemClock
from mscheduler.drivers.base import ChangeEvent, ClaimParams, FinishParams, PingParams, StreamPosition
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
]

WAIT = 30.0


async def test_the_stream_filter_is_pushed_down_to_the_oplog_scan(real_database: Any) -> None:
    """The explain of the stream's aggregation: the leading $match is rewritten into the oplog
    scan's filter (``o.diff.u.wake`` / ``o.diff.i.wake`` / ``o.$set.wake``, ``op``), not run after
    each event is built."""
    driver = MongoDriver(real_database)
    await driver.setup()
    pipeline = [{"$changeStream": {}}, *driver._watch_pipeline()]
    command = {"aggregate": driver.tasks.name, "pipeline": pipeline, "cursor": {}}
    reply = await real_database.command({"explain": command, "verbosity": "queryPlanner"})
    text = json.dumps(reply, default=str)
    assert "o.diff.u.wake" in text or "o.diff.i.wake" in text, f"not pushed down: {text[:3000]}"


async def _items(stream: Any, seconds: float) -> list[ChangeEvent | StreamPosition]:
    found: list[ChangeEvent | StreamPosition] = []

    async def collect() -> None:
        async for item in stream:
            found.append(item)

    try:
        await asyncio.wait_for(collect(), seconds)
    except TimeoutError:
        pass
    return found


async def test_pings_and_claims_build_no_event_retries_and_new_tasks_do(real_database: Any) -> None:
    driver = MongoDriver(real_database)
    await driver.setup()
    publisher = Publisher(driver)
    stream = driver.watch(["job"])
    try:
        await _items(stream, 1.0)  # open
        await publisher.send(Task("t1", "job", option=TaskOption(max_unexpected_retries=3)))
        now = SystemClock().now()
        (claimed,) = await driver.claim(ClaimParams("w1", ["job"], now, ["a1"]))
        for _ in range(5):
            await driver.ping(
                PingParams("w1", SystemClock().now(), {now + timedelta(seconds=30): {"t1": "a1"}})
            )
        error = {"type": "E", "message": "boom", "traceback": None}
        later = SystemClock().now()
        assert await driver.finish(
            [FinishParams("t1", "w1", claimed.attempt, later, "failed", error=error, retry_at=later)]
        )
        events = [item for item in await _items(stream, 2.0) if isinstance(item, ChangeEvent)]
    finally:
        await stream.aclose()
    assert [e.key for e in events] == ["t1", "t1"], "the insert and the retry; no claim, no ping"
    assert events[1].claimers == ("job|*",)


async def test_the_watchers_of_a_process_share_one_server_cursor(real_database: Any) -> None:
    driver = MongoDriver(real_database)
    await driver.setup()
    streams = [driver.watch([f"n{i}"]) for i in range(6)]
    try:
        await asyncio.gather(*(_items(s, 1.0) for s in streams))
        ops = await real_database.client.admin.aggregate(
            [
                {"$currentOp": {"idleCursors": True}},
                {
                    "$match": {
                        "cursor.originatingCommand.pipeline.0.$changeStream": {"$exists": True},
                        "ns": f"{real_database.name}.{driver.tasks.name}",
                    }
                },
            ]
        )
        cursors = [op async for op in ops]
        assert len(cursors) == 1, f"{len(cursors)} change-stream cursors for 6 watchers"
    finally:
        for s in streams:
            await s.aclose()
