"""Discovery (SPEC F5, STYLE 7): change-stream events are hints, polling is the floor."""

from __future__ import annotations

import asyncio
from typing import Any

from mscheduler import Consumer, FakeClock, MongoDriver, Publisher, Task, TaskStatus
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import ChangeStreamUnsupported
from mscheduler.testing.mongomock import mongomock_database
from tests.consumer.support import Harness, ScriptedStreamDriver, settle
from tests.helpers import Recorder


async def _work(params: Any) -> str:
    return "ok"


def _streamed(
    harness: Harness, *openings: BaseException | str, **kwargs: Any
) -> tuple[Consumer, ScriptedStreamDriver]:
    stream = ScriptedStreamDriver(harness.new_driver(), openings)
    kwargs.setdefault("stream_poll_interval", 1000.0)
    consumer = harness.consumer("w1", {"work": _work}, driver=stream, **kwargs)
    return consumer, stream


async def test_a_change_event_wakes_a_consumer_that_would_not_poll_for_ages(harness: Harness) -> None:
    consumer, stream = _streamed(harness, poll_interval=1000.0)
    await harness.start(consumer)
    assert stream.streaming.is_set()
    await harness.publisher.send(Task("t", "work", {}))
    await settle()
    assert harness.claims() == [], "nothing but the event may have told the consumer"
    await stream.push_task("t")
    await harness.recorder.wait("finished", 1)
    assert harness.claims("t") == ["w1"]
    assert harness.recorder.counts["polled"] == 1, "claimed through a poll, not the event"
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED


async def test_an_event_for_a_future_task_wakes_the_consumer_when_it_is_due(harness: Harness) -> None:
    from datetime import timedelta

    from mscheduler import TaskOption

    consumer, stream = _streamed(harness, poll_interval=1000.0)
    await harness.start(consumer)
    run_at = harness.clock.now() + timedelta(seconds=30)
    await harness.publisher.send(Task("later", "work", {}, option=TaskOption(run_at=run_at)))
    await stream.push_task("later")
    await harness.advance(29.0)
    assert harness.claims() == []
    await harness.advance(1.0)
    await harness.recorder.wait("finished", 1)
    assert harness.claims("later") == ["w1"]
    assert harness.recorder.counts["polled"] == 1


async def test_a_broken_stream_falls_back_to_polling_and_reopens_from_the_last_token(
    harness: Harness,
) -> None:
    consumer, stream = _streamed(harness, poll_interval=1.0)
    await harness.start(consumer)
    await harness.publisher.send(Task("t1", "work", {}))
    await stream.push_task("t1")
    await harness.recorder.wait("finished", 1)
    last_token = {"_data": "t1-1"}

    polls = harness.recorder.counts["polled"]
    stream.break_stream(StorageError("connection reset by peer", transient=True))
    await harness.recorder.wait("stream_broken", 1)
    await harness.recorder.wait("polled", polls + 1)  # events may have been missed: poll now
    assert not stream.streaming.is_set()

    await harness.publisher.send(Task("t2", "work", {}))  # no event for it: only a poll finds it
    await harness.advance(1.0)
    await harness.recorder.wait("finished", 2)
    assert harness.claims("t2") == ["w1"]
    assert stream.opened == 2, "the stream was not reopened after the backoff"
    assert stream.resume_tokens == [None, last_token]
    assert stream.streaming.is_set()

    await harness.publisher.send(Task("t3", "work", {}))
    await settle()
    assert harness.claims("t3") == []
    await stream.push_task("t3")
    await harness.recorder.wait("finished", 3)
    assert consumer.error is None and not consumer._stopping


async def test_a_stream_that_cannot_open_is_retried_with_backoff(harness: Harness) -> None:
    broken = StorageError("not primary", transient=True)
    consumer, stream = _streamed(harness, broken, broken, poll_interval=1.0)
    await harness.start(consumer)
    await harness.recorder.wait("stream_broken", 1)
    await harness.advance(0.1)
    await harness.recorder.wait("stream_broken", 2)
    assert stream.opened == 2
    await harness.advance(0.1)
    assert stream.opened == 2, "the backoff must grow"
    await harness.advance(0.15)
    assert stream.opened == 3 and stream.streaming.is_set()
    await harness.publisher.send(Task("t", "work", {}))
    await stream.push_task("t")
    await harness.recorder.wait("finished", 1)
    assert consumer.error is None


async def test_a_poll_requested_while_a_poll_runs_is_not_lost(harness: Harness) -> None:
    """The stream breaks while a poll is in flight whose read predates the missed event."""
    consumer, stream = _streamed(harness, poll_interval=1000.0)
    await harness.start(consumer)
    polls = harness.recorder.counts["polled"]
    stream.freeze("find_wakeups_reply")
    assert consumer.discovery is not None
    consumer.discovery.request_poll()
    await settle()
    assert stream.blocked == ["find_wakeups_reply"], "the poller should be in the middle of a poll"
    await harness.publisher.send(Task("t", "work", {}))  # the poll's read did not see it ...
    stream.break_stream(StorageError("cursor killed", transient=True))  # ... nor the stream
    await harness.recorder.wait("stream_broken", 1)
    stream.thaw("find_wakeups_reply")
    await harness.recorder.wait("polled", polls + 2)
    await harness.recorder.wait("finished", 1)
    assert harness.claims("t") == ["w1"]


async def test_unsupported_change_streams_mean_polling_alone(harness: Harness) -> None:
    consumer, stream = _streamed(harness, ChangeStreamUnsupported("standalone server"), poll_interval=1.0)
    run = asyncio.create_task(consumer.run())
    await harness.recorder.wait("stream_unsupported", 1)
    await harness.publisher.send(Task("t", "work", {}))
    await harness.advance(1.0)
    await harness.recorder.wait("finished", 1)
    await harness.advance(10.0)
    assert stream.opened == 1, "an unsupported stream is not retried"
    assert not run.done() and consumer.error is None
    assert consumer.discovery is not None and consumer.discovery.stream_supported is False
    assert all(not t.done() for name, t in consumer._side.items() if name != "watcher")


async def test_without_change_streams_tasks_are_found_by_polling() -> None:
    """The stand-in refuses ``watch`` as a server without a replica set does (40573)."""
    clock = FakeClock()
    database = mongomock_database()
    publisher = Publisher(MongoDriver(database, create_indexes=True), clock=clock)
    consumer = Consumer(
        MongoDriver(database, create_indexes=True), worker_id="w1", clock=clock, poll_interval=2.0
    )
    consumer.register("work", _work)
    recorder = Recorder(consumer)
    async with consumer:
        await recorder.wait("stream_unsupported", 1)
        await publisher.send(Task("t", "work", {}))
        await settle()
        assert recorder.counts["claimed"] == 0
        clock.advance(1.0)
        await settle()
        assert recorder.counts["claimed"] == 0
        clock.advance(1.0)
        await recorder.wait("finished", 1)
    assert (await publisher.get("t")).results == ["ok"]


async def test_the_post_batch_position_is_kept_and_used_to_reopen(harness: Harness) -> None:
    """A stream that moves on without a matching event still advances the resume token (the
    post-batch token), so a reopen neither replays nor skips what came in between (A7)."""
    from mscheduler.drivers.base import StreamPosition

    consumer, stream = _streamed(harness, poll_interval=1.0)
    await harness.start(consumer)
    stream.push(StreamPosition({"_data": "after-unrelated-writes"}))  # type: ignore[arg-type]
    await settle()
    assert consumer.discovery is not None
    assert consumer.discovery.resume_token == {"_data": "after-unrelated-writes"}
    stream.break_stream(StorageError("connection reset by peer", transient=True))
    await harness.recorder.wait("stream_broken", 1)
    await harness.advance(0.1)
    await settle()
    assert stream.resume_tokens == [None, {"_data": "after-unrelated-writes"}]


async def test_a_lost_resume_token_reopens_from_now_and_polls(harness: Harness) -> None:
    """ChangeStreamHistoryLost (286) and the like: reopen without the token and poll once."""
    from mscheduler.drivers.base import ResumeTokenLost

    consumer, stream = _streamed(harness, poll_interval=1000.0)
    await harness.start(consumer)
    await harness.publisher.send(Task("t1", "work", {}))
    await stream.push_task("t1")
    await harness.recorder.wait("finished", 1)
    stream.openings = [ResumeTokenLost("history lost"), "stream"]
    polls = harness.recorder.counts["polled"]
    stream.break_stream(StorageError("connection reset by peer", transient=True))
    await harness.recorder.wait("stream_broken", 1)
    await harness.recorder.wait("polled", polls + 1)  # the break's own poll
    await harness.publisher.send(Task("t2", "work", {}))  # no event, no poll due for ages
    await harness.advance(0.1)  # the reopen's backoff: it meets the lost token
    await harness.recorder.wait("stream_broken", 2)
    await harness.recorder.wait("finished", 2)  # found by the poll the lost token asked for
    assert stream.resume_tokens[-1] is None, "reopened without the lost token"
    assert stream.streaming.is_set() and consumer.error is None


async def test_an_update_event_naming_only_claimers_wakes_the_right_consumer(harness: Harness) -> None:
    """The Mongo stream delivers updates as changed fields only (no document lookup): a task that
    became claimable by this worker, or by anyone, wakes it; one aimed at others does not."""
    from mscheduler.drivers.base import ChangeEvent

    consumer, stream = _streamed(harness, poll_interval=1000.0)
    await harness.start(consumer)
    await harness.publisher.send(Task("mine", "work", {}))
    await settle()
    assert consumer.discovery is not None
    stream.push(ChangeEvent("other", "work", None, None, (), {"_data": "1"}, ("work|someone-else",)))
    stream.push(ChangeEvent("mine", "work", None, None, (), {"_data": "2"}, ("work|*",)))
    await harness.recorder.wait("finished", 1)
    assert harness.claims("mine") == ["w1"]
    assert harness.recorder.counts["polled"] == 1
