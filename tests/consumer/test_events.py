"""The event log end to end (SPEC F34, F41): what a consumer, a publisher and an operator record,
what a subscriber sees (stream on the memory driver, polling on mongomock), and that recording
adds no storage command to the claim path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    Consumer,
    Event,
    EventKind,
    Events,
    InvalidInput,
    Operations,
    Task,
    TaskContext,
    TaskOption,
)
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import Driver, EventQuery
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.services.events import EventRecorder
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from mscheduler.testing.mongomock import mongomock_database
from tests.consumer.support import Harness, settle


def events_on(harness: Harness) -> None:
    """Every driver of the harness records events."""
    harness.driver.record_events = True
    make = harness.make_driver

    def make_recording(clock: Any) -> Driver:
        driver = make(clock)
        driver.record_events = True
        return driver

    harness.make_driver = make_recording


async def history(harness: Harness, key: str) -> list[tuple[str, str | None, int | None]]:
    events = Events(harness.driver, clock=harness.clock)
    return [(e.kind.value, e.worker_id, e.attempt) for e in await events.list(keys=key)]


def flaky(failures: int) -> Any:
    calls = 0

    async def handler(params: Any, ctx: TaskContext) -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise RuntimeError(f"boom {calls}")
        return "ok"

    return handler


async def collect(source: AsyncIterator[Event], into: list[Event]) -> None:
    async for event in source:
        into.append(event)


async def wait_for(events: list[Event], count: int, harness: Harness, poll: float) -> None:
    """Until ``count`` events arrived: lets the loop run and moves the fake clock by a poll."""
    for _ in range(200):
        if len(events) >= count:
            return
        await harness.advance(poll)
    raise AssertionError(f"saw {len(events)} events, expected {count}: {[e.kind.value for e in events]}")


async def test_a_task_that_fails_twice_then_succeeds_leaves_its_story(harness: Harness) -> None:
    events_on(harness)
    consumer = harness.consumer("w1", {"job": flaky(2)})
    await harness.start(consumer)
    subscriber = Events(harness.driver, clock=harness.clock, poll_interval=0.5)
    seen: list[Event] = []
    follow = asyncio.ensure_future(collect(subscriber.subscribe(keys="t"), seen))
    await settle()
    option = TaskOption(max_unexpected_retries=3, retry_delay=timedelta(seconds=5))
    await harness.publisher.send(Task("t", "job", {}, option=option))
    await harness.discover()
    for n in (1, 2, 3):
        await harness.recorder.wait("finished", n)
        await harness.advance(5.0)  # the retry delay; also the consumer's flush interval
        await harness.discover()
    expected = [
        ("sent", None, None),
        ("claimed", "w1", 1),
        ("retried", "w1", 1),
        ("claimed", "w1", 2),
        ("retried", "w1", 2),
        ("claimed", "w1", 3),
        ("succeeded", "w1", 3),
    ]
    assert await history(harness, "t") == expected
    await wait_for(seen, len(expected), harness, 0.5)
    follow.cancel()
    assert [(e.kind.value, e.worker_id, e.attempt) for e in seen] == expected  # each once, in order
    retried = (await Events(harness.driver, clock=harness.clock).list(kinds="retried"))[0]
    assert retried.detail["error"] == "RuntimeError: boom 1" and retried.detail["retry_at"] is not None
    assert subscriber.polling is isinstance(harness.driver, MongoDriver)  # mongomock cannot watch


async def test_a_task_failed_for_good_ends_with_failed(harness: Harness) -> None:
    events_on(harness)
    consumer = harness.consumer("w1", {"job": flaky(5)})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "job", {}, option=TaskOption(max_unexpected_retries=0)))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    await consumer.stop()  # writes what is buffered
    assert [k for k, _, _ in await history(harness, "t")] == ["sent", "claimed", "failed"]


async def test_a_lost_lease_is_recorded_once_by_the_pass_and_the_worker(harness: Harness) -> None:
    events_on(harness)
    gate = asyncio.Event()

    async def slow(params: Any) -> None:
        await gate.wait()

    stalled = FaultyDriver(harness.new_driver())
    a = harness.consumer("a", {"job": slow}, driver=stalled)
    b = harness.consumer("b", {"job": slow})
    await harness.start(a)
    option = TaskOption(
        worker_timeout=timedelta(seconds=10), ping_interval=timedelta(seconds=3), retry_delay=timedelta(0)
    )
    await harness.publisher.send(Task("t", "job", {}, option=option))
    await harness.discover(a)
    await harness.recorder.wait("claimed", 1)
    stalled.freeze()  # a's pings hang: its lease runs out
    await harness.start(b)
    await harness.advance(11.0)
    await harness.discover(b)  # b's poll marks a's lease lost, then claims
    await harness.recorder.wait("claimed", 2)
    stalled.unfreeze()
    gate.set()
    await harness.recorder.wait("finished", 2)
    await a.stop()
    await b.stop()
    story = await history(harness, "t")
    assert story.count(("lease_lost", "a", 1)) == 1
    assert ("claimed", "b", 2) in story and ("succeeded", "b", 2) in story


async def test_operator_controls_are_recorded(harness: Harness) -> None:
    events_on(harness)
    ops = Operations(harness.driver, clock=harness.clock)
    await harness.publisher.send(Task("t", "job", {}))
    for step in ("pause", "resume"):
        await harness.advance(1.0)
        await getattr(ops, step)("t")
    await harness.advance(1.0)
    await ops.cancel("t", "not needed")
    await harness.advance(1.0)
    await ops.restart("t")
    await harness.advance(1.0)
    await ops.remove("t")
    story = [k for k, _, _ in await history(harness, "t")]
    assert story == ["sent", "paused", "resumed", "cancelled", "restarted", "removed"]


async def test_recording_adds_no_command_to_the_claim_path() -> None:
    """Per-task commands (claim, finish) are the same with events on and off; the consumer's
    events wait in its buffer and are written in one insert (here at stop: the clock does not
    move, so no flush interval passes)."""
    from mscheduler import FakeClock, Publisher

    async def run(record: bool) -> tuple[dict[str, int], int]:
        clock = FakeClock()
        driver = _Counting(mongomock_database(), events=record, create_indexes=True)
        publisher = Publisher(driver, clock=clock)
        consumer = Consumer(driver, clock=clock, concurrency=5, worker_id="w", planner=False)
        done = asyncio.Event()
        finished = 0

        async def job() -> None:
            return None

        def listener(event: str, data: dict[str, Any]) -> None:
            nonlocal finished
            if event == "finished":
                finished += 1
                if finished == 20:
                    done.set()

        consumer.register("job", job)
        consumer.add_listener(listener)
        await consumer.start()
        await publisher.send_many([Task(f"t{i}", "job") for i in range(20)])
        assert consumer.discovery is not None
        await consumer.discovery.poll_once()
        await asyncio.wait_for(done.wait(), 10)
        counts = dict(driver.by_operation)
        await consumer.stop()
        stored = len(await driver.list_events(EventQuery(limit=1000)))
        return counts, stored

    off, none = await run(False)
    on, stored = await run(True)
    assert none == 0
    assert stored == 20 * 3  # sent, claimed, succeeded
    for operation in ("claim", "finish"):
        assert on.get(operation) == off.get(operation), operation
    assert "insert events" not in off
    assert on.get("insert events") == 1  # the publisher's sent events, with its insert


class _Counting(MongoDriver):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.by_operation: dict[str, int] = {}

    async def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        self.by_operation[what] = self.by_operation.get(what, 0) + 1
        return await super()._call(what, *args, **kwargs)


async def test_a_crashed_consumer_loses_only_its_buffered_events(harness: Harness) -> None:
    events_on(harness)
    faulty = FaultyDriver(harness.new_driver())
    # Built by hand, not through the harness: a crashed consumer must not be stopped again.
    consumer = Consumer(faulty, worker_id="w1", clock=harness.clock, poll_interval=1.0)
    consumer.register("job", flaky(0))
    harness.recorder.attach(consumer)
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "job", {}))
    await harness.discover(consumer)
    await harness.recorder.wait("finished", 1)
    await crash_consumer(consumer)
    assert [k for k, _, _ in await history(harness, "t")] == ["sent"]  # claimed, succeeded lost
    info = await harness.get("t")
    assert info.status.value == "succeeded" and info.worker_states[0].worker_id == "w1"  # the truth


async def test_the_recorder_keeps_the_newest_while_the_store_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from mscheduler import FakeClock, MemoryDriver

    clock = FakeClock()
    store = FaultyDriver(MemoryDriver(clock=clock, events=True))
    recorder = EventRecorder(store, clock, flush_size=2, max_buffer=3)
    for i in range(5):
        recorder.attempt_event(EventKind.CLAIMED, f"k{i}", "job", f"a{i}", 1, "w")
    assert len(recorder) == 3 and recorder.dropped == 2
    assert "dropping the oldest" in caplog.text
    store.fail_next("insert_events", error=StorageError("down", transient=True))
    assert await recorder.flush() is False and len(recorder) == 3  # kept for the next try
    assert await recorder.flush() is True and len(recorder) == 0
    stored = await store.list_events(EventQuery())
    assert [d["key"] for d in stored] == ["k2", "k3", "k4"]
    store.fail_next("insert_events", error=StorageError("unauthorized", config=True))
    recorder.attempt_event(EventKind.CLAIMED, "k9", "job", "a9", 1, "w")
    with pytest.raises(StorageError):
        await recorder.flush()  # a configuration error stops the consumer loudly
    assert len(recorder) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"kinds": ["exploded"]},
        {"names": ["bad name"]},
        {"keys": [""]},
        {"plans": [{"$gt": ""}]},
        {"since": "yesterday"},
    ],
)
async def test_bad_event_queries_are_refused(bad: dict[str, Any]) -> None:
    from mscheduler import MemoryDriver

    events = Events(MemoryDriver(events=True))
    with pytest.raises(InvalidInput):
        await events.list(**bad)
    with pytest.raises(InvalidInput):
        events.subscribe(**bad)
    with pytest.raises(InvalidInput):
        await events.list(limit=0)


def test_the_documented_events_example_runs_and_prints_what_it_says() -> None:
    import re
    import subprocess
    import sys

    from tests.acceptance.support import REPO, environment

    page = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL) if "events.subscribe(" in b
    ]
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=REPO, env=environment(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['sent', 'claimed', 'succeeded'] True"]
    assert "prints `['sent', 'claimed', 'succeeded'] True`" in page


async def test_operator_events_in_one_millisecond_are_all_kept_in_the_order_written(
    harness: Harness,
) -> None:
    """Issue 17 A3: five pause / resume pairs in one millisecond (the clock does not move) are ten
    events with ten ids, listed in the order they were written (not alphabetically)."""
    events_on(harness)
    ops = Operations(harness.driver, clock=harness.clock)
    await harness.publisher.send(Task("t", "job", {}))
    for _ in range(5):
        await ops.pause("t")
        await ops.resume("t")
    listed = await Events(harness.driver, clock=harness.clock).list(keys="t")
    assert [e.kind.value for e in listed] == ["sent"] + ["paused", "resumed"] * 5
    assert len({e.id for e in listed}) == 11
    assert {e.time for e in listed} == {harness.clock.now()}
    mine = [e.seq for e in listed if e.writer == listed[1].writer]
    assert mine == sorted(mine) and len(set(mine)) == len(mine)  # the writer's own sequence


async def test_a_task_s_story_across_writers_and_generations_in_one_millisecond(harness: Harness) -> None:
    """Issue 17 A3: a publisher's send, a consumer's claims and outcomes and an operator's restart,
    all in one millisecond, are listed in the order the writes happened: the restart after the
    first generation's failure, the second generation's claim after the restart."""
    events_on(harness)
    consumer = harness.consumer("w1", {"job": flaky(1)})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "job", {}, option=TaskOption(max_unexpected_retries=0)))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    await consumer.events.flush()  # type: ignore[union-attr]
    await Operations(harness.driver, clock=harness.clock).restart("t")
    await harness.discover()
    await harness.recorder.wait("finished", 2)
    await consumer.stop()
    story = await history(harness, "t")
    assert story == [
        ("sent", None, None),
        ("claimed", "w1", 1),
        ("failed", "w1", 1),
        ("restarted", None, None),
        ("claimed", "w1", 1),
        ("succeeded", "w1", 1),
    ]
    listed = await Events(harness.driver, clock=harness.clock).list(keys="t")
    assert {e.time for e in listed} == {harness.clock.now()}  # all in one millisecond


async def test_a_subscription_since_now_sees_an_event_written_in_the_same_millisecond(
    harness: Harness,
) -> None:
    """Issue 17 A3: ``since`` keeps microseconds, stored times do not: an event written right after
    ``subscribe(since=now)``, in the same millisecond, is not missed."""
    events_on(harness)
    subscriber = Events(harness.driver, clock=harness.clock, poll_interval=0.5)
    since = harness.clock.now() + timedelta(microseconds=700)  # later in the same millisecond
    seen: list[Event] = []
    source = subscriber.subscribe(keys="t", since=since)
    await harness.publisher.send(Task("t", "job", {}))  # after the call, at the clock's millisecond
    follow = asyncio.ensure_future(collect(source, seen))
    await wait_for(seen, 1, harness, 0.5)
    follow.cancel()
    assert [e.kind.value for e in seen] == ["sent"]
