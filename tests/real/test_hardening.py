"""What only a real server shows (issue 6: A4, A5, A7): an existing key inside the caller's
transaction, a result too large to store, and change streams reopened with a token the server
cannot resume from."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler import Consumer, MongoDriver, Publisher, Task, TaskFailed, TaskOption, TaskStatus
from mscheduler.domain.clock import SystemClock
from mscheduler.drivers.base import ChangeEvent, ClaimParams, ResumeTokenLost, StreamPosition
from mscheduler.runtime.consumer.discovery import CLAIM, Discovery
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
]

WAIT = 30.0  # seconds: a real server answers in milliseconds; this only bounds a hang
BSON_LIMIT = 16 * 1024 * 1024
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=5),
    retry_delay=timedelta(milliseconds=200),
    max_unexpected_retries=3,
)


async def new_driver(database: Any) -> MongoDriver:
    driver = MongoDriver(database)
    await driver.setup()
    return driver


# -- A4: an existing key inside the caller's transaction -----------------------------------------


async def test_an_existing_key_in_a_transaction_returns_false_and_the_transaction_commits(
    real_database: Any,
) -> None:
    """A duplicate key error would abort the caller's transaction although ``send`` returned
    False; inside a transaction an existing key is an upsert that changes nothing."""
    driver = await new_driver(real_database)
    publisher = Publisher(driver)
    orders = real_database["orders"]
    await orders.insert_one({"_id": "seed"})  # collections must exist before a transaction
    assert await publisher.send(Task("invoice-1", "invoice", {"version": 1}))

    async def work(session: Any) -> tuple[bool, bool, list[bool]]:
        await orders.insert_one({"_id": "o1"}, session=session)
        existing = await publisher.send(Task("invoice-1", "invoice", {"version": 2}), session=session)
        created = await publisher.send(Task("invoice-2", "invoice", {"version": 2}), session=session)
        many = await publisher.send_many(
            [Task("invoice-1", "invoice", {"version": 3}), Task("invoice-3", "invoice", {"version": 3})],
            session=session,
        )
        # still usable after the existing keys: nothing aborted it
        await orders.insert_one({"_id": "o2"}, session=session)
        return existing, created, many

    async with real_database.client.start_session() as session:
        existing, created, many = await session.with_transaction(work)

    assert (existing, created, many) == (False, True, [False, True])
    # the transaction committed: the caller's writes and the new tasks landed
    assert await orders.count_documents({"_id": {"$in": ["o1", "o2"]}}) == 2
    kept = await driver.get_task("invoice-1")
    assert kept is not None and kept["params"] == {"version": 1}, "an existing task is left alone"
    for key in ("invoice-2", "invoice-3"):
        stored = await driver.tasks.find_one({"key": key})
        assert stored is not None, f"{key} was not created"
        # a whole task, keyed like one inserted outside a transaction (change events rely on it)
        assert stored["_id"] == key
        assert stored["state"]["status"] == "pending" and stored["state"]["claimers"] == ["invoice|*"]


# -- A5: a result too large to store -------------------------------------------------------------


MIB = 1024 * 1024
RESULT_CASES = [
    # refused by the consumer's cap, before any write
    pytest.param({}, {"max_result_bytes": 64 * 1024}, 0, 100 * 1024, id="over-the-cap"),
    pytest.param({}, {}, 0, BSON_LIMIT + MIB, id="over-16MiB"),
    # under the cap, but params + result make a document the server refuses (over 16 MiB)
    pytest.param(
        {"max_params_bytes": 8 * MIB},
        {"max_result_bytes": 12 * MIB},
        7 * MIB,
        10 * MIB,
        id="document-over-16MiB-on-the-server",
    ),
]


@pytest.mark.parametrize(("publisher_options", "consumer_options", "params_size", "size"), RESULT_CASES)
async def test_an_oversized_result_fails_its_task_once_and_the_consumer_carries_on(
    real_database: Any,
    publisher_options: dict[str, Any],
    consumer_options: dict[str, Any],
    params_size: int,
    size: int,
) -> None:
    """A5: the attempt fails for good with the reason (a result is deterministic: no retry), and
    the consumer goes on with the next task."""
    driver = await new_driver(real_database)
    publisher = Publisher(driver, **publisher_options)
    consumer = Consumer(
        driver, worker_id="w-results", poll_interval=0.2, grace_period=1.0, **consumer_options
    )
    calls: list[str] = []

    @consumer.handler("big")
    async def big(params: Any) -> str:
        calls.append("big")
        return "x" * size

    @consumer.handler("small")
    async def small(params: Any) -> str:
        calls.append("small")
        return "ok"

    params = {"blob": "p" * params_size} if params_size else None
    async with consumer:
        await publisher.send(Task("big-1", "big", params, option=OPTION))
        with pytest.raises(TaskFailed) as failed:
            await publisher.wait("big-1", timeout=WAIT)
        # well past the retry delay: a retry would have started by now
        await asyncio.sleep(5 * OPTION.retry_delay.total_seconds())
        assert consumer.error is None, f"the consumer stopped: {consumer.error!r}"

        await publisher.send(Task("small-1", "small", option=OPTION))
        assert await publisher.wait("small-1", timeout=WAIT) == "ok", "the consumer runs the next task"
        assert consumer.error is None, f"the consumer stopped: {consumer.error!r}"

    info = await publisher.get("big-1")
    assert info.status is TaskStatus.FAILED
    assert len(info.worker_states) == 1, "an outcome that cannot be stored fails at once: no retry"
    assert calls.count("big") == 1
    assert info.worker_states[0].result is None
    error = failed.value.error
    assert error is not None, "the reason is recorded on the task"
    reason = f"{error.get('type')}: {error.get('message')}".lower()
    assert "large" in reason and ("result" in reason or "outcome" in reason), f"an unclear reason: {reason}"


# -- A7: change streams and resume tokens ---------------------------------------------------------


async def _token_from_another_collection(database: Any) -> Any:
    """The resume token of an event on another collection: valid, but not in the tasks' stream."""
    other = database["another_collection"]
    async with await other.watch() as stream:
        await other.insert_one({"n": 1})
        change = await asyncio.wait_for(stream.next(), WAIT)
    return change["_id"]


async def _collect_until(
    stream: AsyncIterator[ChangeEvent | StreamPosition],
    done: Callable[[ChangeEvent | StreamPosition], bool],
    seen: list[ChangeEvent | StreamPosition],
) -> ChangeEvent | StreamPosition:
    """Read the stream into ``seen`` until an item satisfies ``done``; that item."""

    async def read() -> ChangeEvent | StreamPosition:
        async for item in stream:
            seen.append(item)
            if done(item):
                return item
        raise AssertionError(f"the stream ended; it yielded {seen}")

    return await asyncio.wait_for(read(), WAIT)


def _keys(items: list[ChangeEvent | StreamPosition]) -> list[str]:
    return [item.key for item in items if isinstance(item, ChangeEvent)]


BAD_TOKENS = [
    pytest.param(None, id="another-collections-token"),  # ChangeStreamFatalError (280) at open
    pytest.param({"_data": "zzzz"}, id="not-hex"),  # FailedToParse (9)
    pytest.param({"_data": "00"}, id="not-a-token"),  # a KeyString format error
    pytest.param({"_data": ""}, id="empty"),  # an invalid empty resume token
]


@pytest.mark.parametrize("token", BAD_TOKENS)
async def test_a_token_the_server_cannot_resume_from_raises_resume_token_lost(
    real_database: Any, token: Any
) -> None:
    """Whatever is wrong with the token, the driver says ``ResumeTokenLost`` (the consumer then
    reopens from now and polls once), never a storage error that would stop the watcher."""
    driver = await new_driver(real_database)
    publisher = Publisher(driver)
    if token is None:
        token = await _token_from_another_collection(real_database)
    # an event of the tasks' collection after the token: the server sees the token is not there
    await publisher.send(Task("after-the-token", "alpha"))
    stream = driver.watch(["alpha"], resume_token=token)
    seen: list[ChangeEvent | StreamPosition] = []
    try:
        with pytest.raises(ResumeTokenLost):
            await _collect_until(stream, lambda item: False, seen)
    finally:
        await stream.aclose()
    assert _keys(seen) == [], "no event is delivered from a token that cannot be resumed"


async def test_discovery_recovers_from_a_token_it_cannot_resume_from(real_database: Any) -> None:
    """The watcher reopens from now, asks for a poll (the changes in between are not coming),
    and goes on delivering changes."""
    driver = await new_driver(real_database)
    publisher = Publisher(driver)
    bad = await _token_from_another_collection(real_database)
    await publisher.send(Task("missed", "alpha"))

    events: list[tuple[str, dict[str, Any]]] = []
    discovery = Discovery(
        driver,
        SystemClock(),
        worker_id="w-discovery",
        names=["alpha"],
        poll_interval=0.5,
        stream_poll_interval=10.0,
        batch_size=100,
        max_size=1000,
        on_event=lambda event, data: events.append((event, data)),
    )
    polls: list[bool] = []
    discovery.request_poll = lambda: polls.append(True)  # type: ignore[method-assign]
    discovery.resume_token = bad
    watcher = asyncio.create_task(discovery.run_watcher())

    async def until(condition: Callable[[], bool], what: str) -> None:
        async def wait() -> None:
            while not condition():
                if watcher.done():
                    raise AssertionError(f"the watcher ended while waiting for {what}: {watcher!r}")
                await asyncio.sleep(0.05)

        await asyncio.wait_for(wait(), WAIT)

    try:
        await until(lambda: any(event == "stream_broken" for event, _ in events), "stream_broken")
        assert polls, "a poll is asked for: the changes in between are not coming"
        await until(lambda: discovery.streaming and discovery.resume_token is not None, "a new stream")
        assert discovery.resume_token != bad
        await publisher.send(Task("seen", "alpha"))
        await until(lambda: len(discovery.queue) > 0, "the change of 'seen'")
        due = discovery.queue.pop_due(datetime(9999, 1, 1, tzinfo=UTC))
        assert due.get(CLAIM) == {"seen"}, f"only the change after the reopen: {due}"
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_a_post_batch_token_resumes_without_replaying_old_events(real_database: Any) -> None:
    """The stream's position after an unrelated write (a post-batch resume token, not an event's)
    resumes after what was already seen: nothing is replayed, nothing is missed."""
    driver = await new_driver(real_database)
    publisher = Publisher(driver)

    first = driver.watch(["alpha"])
    seen: list[ChangeEvent | StreamPosition] = []
    try:
        # the stream is open once it has said where it is
        await _collect_until(first, lambda item: isinstance(item, StreamPosition), seen)
        await publisher.send(Task("old", "alpha"))
        old = await _collect_until(first, lambda item: isinstance(item, ChangeEvent), seen)
        assert isinstance(old, ChangeEvent) and old.key == "old"
        # a write the stream does not deliver (another name) moves its position on
        await publisher.send(Task("unrelated", "gamma"))
        position = await _collect_until(first, lambda item: isinstance(item, StreamPosition), seen)
    finally:
        await first.aclose()
    assert isinstance(position, StreamPosition) and position.token is not None
    assert position.token != old.token, "a post-batch token, past the last event"
    assert _keys(seen) == ["old"]

    await publisher.send(Task("new", "alpha"))
    resumed = driver.watch(["alpha"], resume_token=position.token)
    after: list[ChangeEvent | StreamPosition] = []
    try:
        await _collect_until(resumed, lambda item: isinstance(item, ChangeEvent) and item.key == "new", after)
    finally:
        await resumed.aclose()
    assert _keys(after) == ["new"], f"resumed from the position: no replay of 'old', got {_keys(after)}"


async def test_an_update_event_says_every_worker_that_may_still_claim(real_database: Any) -> None:
    """``ChangeEvent.claimers`` is who may claim the task now (or None where unknown): never a
    part of it. The server may report an array change element by element (``state.claimers.3``
    plus ``truncatedArrays``) rather than as the whole array; read as the whole list, that part
    would make a worker that may still claim the task drop its wake-up."""
    driver = await new_driver(real_database)
    publisher = Publisher(driver)
    workers = tuple(f"w{i}" for i in range(1, 7))
    option = TaskOption(specific_worker_ids=workers, concurrent_worker_cnt=2)
    await publisher.send(Task("shared", "fan", option=option))

    stream = driver.watch(["fan"])
    seen: list[ChangeEvent | StreamPosition] = []
    try:
        await _collect_until(stream, lambda item: isinstance(item, StreamPosition), seen)  # open
        # w3 claims: the claimers go from [w1 .. w6] to [w1, w2, w4, w5, w6]
        now = SystemClock().now()
        (claimed,) = await driver.claim(ClaimParams("w3", ["fan"], now, ["attempt-w3"]))
        assert claimed.key == "shared"
        event = await _collect_until(stream, lambda item: isinstance(item, ChangeEvent), seen)
    finally:
        await stream.aclose()
    stored = await driver.get_task("shared")
    assert stored is not None
    expected = [f"fan|{w}" for w in workers if w != "w3"]
    assert stored["state"]["claimers"] == expected
    assert isinstance(event, ChangeEvent) and event.key == "shared"
    if event.claimers is not None and not event.claimers_complete:
        # reported element-wise: those listed may claim, and nobody drops a wake-up for it
        assert set(event.claimers) <= set(expected), event.claimers
    else:
        assert event.claimers is None or sorted(event.claimers) == sorted(expected), (
            f"the event says only {event.claimers} may claim; {expected} may"
        )
