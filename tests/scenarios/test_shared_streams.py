"""One change stream per process and collection (issue 18.6), fanned out to every subscriber: the
consumers' discovery, the remote executors' waiting leases and the event log's subscriptions
(the API's server-sent events). On a fake Mongo collection that can watch (mongomock cannot),
the memory driver, and mongomock for the shared event poller.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, MemoryDriver, MongoDriver, Publisher, Task, TaskOption
from mscheduler.drivers.base import (
    ChangeEvent,
    ClaimParams,
    ControlParams,
    FinishParams,
    PingParams,
    StreamPosition,
)
from mscheduler.services.events import Events
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.mongo_fakes import Database

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class FakeChangeStream:
    """A server's change stream as PyMongo hands it out: ``try_next`` (None when nothing new),
    ``resume_token``, ``alive``, ``close``."""

    def __init__(self, owner: WatchableCollection, pipeline: list[dict[str, Any]]) -> None:
        self.owner = owner
        self.pipeline = pipeline
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.resume_token: Any = {"_data": "0"}
        self.alive = True

    async def try_next(self) -> dict[str, Any] | None:
        try:
            change = await asyncio.wait_for(self.queue.get(), 0.01)
        except TimeoutError:
            return None
        self.resume_token = change["_id"]
        return change

    async def close(self) -> None:
        self.alive = False
        self.owner.open.remove(self)


class WatchableCollection:
    """A mongomock collection that can watch: ``watch`` opens a ``FakeChangeStream`` (counted);
    ``announce`` hands a change event (already through the pipeline's stages) to the open ones."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.opened = 0
        self.open: list[FakeChangeStream] = []
        self.pipelines: list[list[dict[str, Any]]] = []

    async def watch(self, pipeline: list[dict[str, Any]], **kwargs: Any) -> FakeChangeStream:
        self.opened += 1
        self.pipelines.append(pipeline)
        stream = FakeChangeStream(self, pipeline)
        self.open.append(stream)
        return stream

    def announce(self, change: dict[str, Any]) -> None:
        for stream in self.open:
            stream.queue.put_nowait(change)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def insert_event(n: int, key: str, name: str) -> dict[str, Any]:
    return {
        "_id": {"_data": str(n)},
        "operationType": "insert",
        "documentKey": {"_id": key},
        "fullDocument": {
            "key": key,
            "name": name,
            "option": {"specific_worker_ids": []},
            "state": {"claim_at": NOW, "claimers": [f"{name}|*"], "worker_states": []},
        },
    }


async def next_event(subscription: Any) -> ChangeEvent:
    while True:
        item = await asyncio.wait_for(anext(subscription), 2)
        if isinstance(item, ChangeEvent):
            return item
        assert isinstance(item, StreamPosition)


async def test_every_watcher_of_a_process_shares_one_change_stream_filtered_by_name() -> None:
    """Three watchers of one store (two of one name, one of another) and a second driver object
    over the same collection: one stream is opened, each watcher gets its names' events, the
    stream closes when the last leaves and opens again for the next one."""
    inner = mongomock_database()
    tasks = WatchableCollection(inner["mscheduler_tasks"])
    database = Database(inner, {"mscheduler_tasks": tasks})
    driver, other_driver = MongoDriver(database, majority=False), MongoDriver(database, majority=False)
    a, b = driver.watch(["job"]), other_driver.watch(["job", "x"])
    c = driver.watch(["other"])
    first = asyncio.ensure_future(next_event(a))
    await asyncio.sleep(0.05)
    assert tasks.opened == 1
    tasks.announce(insert_event(1, "t1", "job"))
    tasks.announce(insert_event(2, "t2", "other"))
    assert (await first).key == "t1"
    assert (await next_event(b)).key == "t1"
    assert (await next_event(c)).key == "t2", "another name: only its watcher gets it"
    assert tasks.opened == 1, "one stream for the three"
    for subscription in (a, b, c):
        await subscription.aclose()
    await asyncio.sleep(0.05)
    assert tasks.open == [], "closed with its last subscriber"
    d = driver.watch(["job"])
    pending = asyncio.ensure_future(next_event(d))
    await asyncio.sleep(0.05)
    assert tasks.opened == 2
    tasks.announce(insert_event(3, "t3", "job"))
    assert (await pending).key == "t3"
    await d.aclose()


async def test_consumers_and_waiting_leases_of_a_process_share_the_stream() -> None:
    """Five consumers of one process and the API server's waiting executor leases: one stream."""
    from mscheduler.remote.executors import RemoteExecutors

    inner = mongomock_database()
    tasks = WatchableCollection(inner["mscheduler_tasks"])
    database = Database(inner, {"mscheduler_tasks": tasks})
    driver = MongoDriver(database, majority=False)
    await driver.setup()
    consumers = [Consumer(driver, worker_id=f"w{i}", poll_interval=60.0) for i in range(5)]
    for consumer in consumers:

        @consumer.handler("job")
        async def job(params: Any) -> None:
            return None

        await consumer.start()
    executors = RemoteExecutors(driver)
    leases = [
        asyncio.ensure_future(executors.lease(f"ex{i}", [f"job{i}"], max_tasks=1, wait=5)) for i in range(3)
    ]
    await asyncio.sleep(0.2)
    try:
        assert tasks.opened == 1, f"{tasks.opened} change streams for 5 consumers and 3 waiting leases"
    finally:
        for lease in leases:
            lease.cancel()
        await asyncio.gather(*leases, return_exceptions=True)
        for consumer in consumers:
            await consumer.stop()
        await executors.aclose()


async def test_the_memory_driver_feeds_its_watchers_through_the_same_fan_out() -> None:
    clock = FakeClock(NOW)
    driver = MemoryDriver(clock=clock)
    job, other = driver.watch(["job"]), driver.watch(["other"])
    await Publisher(driver, clock=clock).send_many([Task("t1", "job"), Task("t2", "other")])
    assert (await next_event(job)).key == "t1"
    assert (await next_event(other)).key == "t2"
    assert job.queue.empty() and other.queue.empty(), "each its own names"
    await job.aclose()
    await other.aclose()


async def test_the_memory_driver_announces_what_the_mongo_stream_passes() -> None:
    """Inserts, a retry (claimable again), a cancel asking a running attempt to stop: announced.
    A claim, a ping, a finish that ends the task: not (the Mongo stream's $match on ``wake``
    drops them; the memory driver announced every write before issue 21)."""
    clock = FakeClock(NOW)
    driver = MemoryDriver(clock=clock)
    job = driver.watch(["job"])
    option = TaskOption(retry_delay=timedelta(0))
    await Publisher(driver, clock=clock).send_many([Task("t1", "job", option=option), Task("t2", "job")])
    assert [(await next_event(job)).key for _ in range(2)] == ["t1", "t2"]  # inserts
    claimed = await driver.claim(ClaimParams("w1", ["job"], clock.now(), ["a1", "a2"]))
    assert sorted(t.key for t in claimed) == ["t1", "t2"]
    expire = clock.now() + timedelta(seconds=30)
    await driver.ping(PingParams("w1", clock.now(), {expire: {"t1": "a1", "t2": "a2"}}))
    await driver.finish([FinishParams("t2", "w1", "a2", clock.now(), "succeeded")])
    await asyncio.sleep(0)
    assert job.queue.empty(), "a claim, a ping, a finish that ends the task: nothing announced"
    error = {"type": "Boom", "message": "", "traceback": None}
    await driver.finish(
        [FinishParams("t1", "w1", "a1", clock.now(), "failed", error=error, retry_at=clock.now())]
    )
    assert (await next_event(job)).key == "t1"  # a retry: claimable again
    await driver.claim(ClaimParams("w1", ["job"], clock.now(), ["a3"]))
    assert await driver.control_task(ControlParams("t1", "cancel", ["pending", "running"], clock.now()))
    stop = await next_event(job)
    assert stop.key == "t1" and stop.stop == "cancel" and stop.stop_attempts == ("a3",)
    await job.aclose()


async def test_event_subscriptions_share_one_poller_where_the_store_cannot_watch() -> None:
    """Without change streams the event log is polled: one poll per interval for the process,
    not one per subscription (each subscription reads once when it starts, for what was stored
    before it joined)."""
    clock = FakeClock(NOW)
    driver = MongoDriver(mongomock_database(), create_indexes=True, events=True)
    await driver.setup()
    reads: Counter[str] = Counter()
    list_events = driver.list_events

    async def counting(query: Any) -> Any:
        reads["list_events"] += 1
        return await list_events(query)

    driver.list_events = counting  # type: ignore[method-assign]
    events = Events(driver, clock=clock, poll_interval=1.0)
    subscriptions = [events.subscribe(names=["job"]) for _ in range(4)]
    firsts = [asyncio.ensure_future(anext(s)) for s in subscriptions]
    await asyncio.sleep(0.05)
    await Publisher(driver, clock=clock).send(Task("t1", "job"))
    before = reads["list_events"]
    for _ in range(5):
        clock.advance(timedelta(seconds=1))
        await asyncio.sleep(0.02)
    got = await asyncio.wait_for(asyncio.gather(*firsts), 2)
    assert [e.key for e in got] == ["t1"] * 4
    polls = reads["list_events"] - before
    assert polls <= 6, f"{polls} reads in 5 poll intervals for 4 subscriptions: one poller"
    for s in subscriptions:
        await s.aclose()
