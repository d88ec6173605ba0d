"""The event log's driver operations (SPEC F34): every driver.

Store writes record their own events (``sent``, controls, ``edited``, ``expired``, ``lease_lost``
of a lease pass) when ``record_events`` is on, and nothing when it is off; ``insert_events`` is
idempotent by id; ``list_events`` filters and orders; streams where the store has them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler.domain.events import EventKind, EventWriter, attempt_event_id, event_doc, task_event
from mscheduler.domain.plans import occurrence_key
from mscheduler.drivers.base import (
    ChangeStreamUnsupported,
    ControlParams,
    Driver,
    EventQuery,
    ExpireParams,
    InsertEventsParams,
    UpdateOptionParams,
)
from mscheduler.drivers.memory.driver import MemoryDriver
from tests.conformance.support import Store

WRITER = EventWriter("test")


@pytest.fixture
async def events(store: Store) -> Store:
    """The store with event recording on (indexes created by a second setup)."""
    store.driver.record_events = True
    await store.driver.setup()
    return store


async def listed(store: Store, **query: Any) -> list[dict[str, Any]]:
    return await store.driver.list_events(EventQuery(limit=1000, **query))


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def an_event(
    store: Store, key: str, kind: EventKind = EventKind.CLAIMED, attempt: str = "a1"
) -> dict[str, Any]:
    return event_doc(
        kind,
        key,
        "job",
        store.now,
        writer=WRITER,
        event_id=attempt_event_id(key, attempt, kind),
        worker_id="w1",
        attempt=1,
        detail={"error": "x" * 1000, "n": 3},
    )


async def test_nothing_is_recorded_while_events_are_off(store: Store) -> None:
    assert store.driver.record_events is False
    await store.add("t", deadline=store.at(5))
    claimed = await store.claim_one("w1", lease=timedelta(seconds=2))
    assert claimed is not None
    await store.add("u", deadline=store.at(5))
    store.advance(10)
    assert await store.expire() == 1
    assert await store.driver.expire_deadlines(ExpireParams(store.now)) == 2  # t is pending again
    await store.driver.control_task(ControlParams("t", "remove", ["expired"], store.now))
    assert await listed(store) == []


async def test_inserted_events_read_back_and_a_second_insert_of_an_id_is_skipped(events: Store) -> None:
    first = an_event(events, "t")
    assert await events.driver.insert_events(InsertEventsParams([first], events.now)) == 1
    again = an_event(events, "t") | {"detail": {"other": 1}}
    other = an_event(events, "t", EventKind.SUCCEEDED)
    assert await events.driver.insert_events(InsertEventsParams([again, other], events.now)) == 1
    docs = await listed(events, keys=["t"])
    assert kinds(docs) == ["claimed", "succeeded"]
    stored = docs[0]
    assert stored["id"] == "t|a1|claimed" and stored["written"] == events.now and stored["time"] == events.now
    assert stored["worker_id"] == "w1" and stored["attempt"] == 1 and stored["name"] == "job"
    assert stored["detail"]["n"] == 3 and len(stored["detail"]["error"]) == 300  # kept short
    assert stored["time"].tzinfo is not None


async def test_sent_is_recorded_for_created_tasks_only(events: Store) -> None:
    assert await events.add("t") is True
    events.advance(1)
    assert await events.add("t") is False  # exists: nothing happened
    docs = await listed(events)
    assert [(d["kind"], d["key"], d["name"]) for d in docs] == [("sent", "t", "job")]


async def test_list_filters_orders_and_pages(events: Store) -> None:
    for i, key in enumerate(["b", "a", "c"]):
        await events.add(key, name="job" if i != 2 else "other")
        events.advance(1)
    assert [d["key"] for d in await listed(events)] == ["b", "a", "c"]  # time order
    assert [d["key"] for d in await listed(events, names=["other"])] == ["c"]
    assert [d["key"] for d in await listed(events, keys=["a", "c"])] == ["a", "c"]
    assert await listed(events, kinds=["claimed"]) == []
    middle = await listed(events, time_from=events.at(-2), time_to=events.at(-1))
    assert [d["key"] for d in middle] == ["a"]
    page = await events.driver.list_events(EventQuery(skip=1, limit=1))
    assert [d["key"] for d in page] == ["a"]


async def test_paging_by_written_position(events: Store) -> None:
    batch = [an_event(events, key) for key in ("k1", "k2", "k3")]
    await events.driver.insert_events(InsertEventsParams(batch, events.now))
    events.advance(1)
    await events.driver.insert_events(InsertEventsParams([an_event(events, "k0")], events.now))
    first = await events.driver.list_events(EventQuery(by_written=True, limit=2))
    assert [d["key"] for d in first] == ["k1", "k2"]  # written, then id
    after = (first[-1]["written"], first[-1]["id"])
    rest = await events.driver.list_events(EventQuery(by_written=True, after=after, limit=10))
    assert [d["key"] for d in rest] == ["k3", "k0"]
    late = await events.driver.list_events(EventQuery(by_written=True, written_from=events.now))
    assert [d["key"] for d in late] == ["k0"]


async def test_a_lease_pass_records_lease_lost_once_with_worker_and_attempt(events: Store) -> None:
    await events.add("t")
    await events.add("u")
    lost = await events.claim_one("w1", lease=timedelta(seconds=5))
    kept = await events.claim_one("w2", lease=timedelta(seconds=60))
    assert lost is not None and kept is not None
    events.advance(10)
    assert await events.expire() == 1
    assert await events.expire() == 0  # a second pass (another consumer's) finds nothing more
    docs = await listed(events, kinds=["lease_lost"])
    assert len(docs) == 1
    (doc,) = docs
    assert (doc["key"], doc["worker_id"], doc["attempt"]) == (lost.key, "w1", 1)
    assert doc["id"] == attempt_event_id(lost.key, lost.attempt, EventKind.LEASE_LOST)
    assert doc["detail"]["by"] == "lease pass"
    assert (await events.entry(lost.key, lost.attempt))["status"] == "lost"


async def test_the_worker_s_own_lease_lost_event_and_the_pass_s_are_one(events: Store) -> None:
    await events.add("t")
    claimed = await events.claim_one("w1", lease=timedelta(seconds=5))
    assert claimed is not None
    events.advance(10)
    mine = event_doc(
        EventKind.LEASE_LOST,
        "t",
        "job",
        events.now,
        writer=WRITER,
        event_id=attempt_event_id("t", claimed.attempt, EventKind.LEASE_LOST),
        worker_id="w1",
        attempt=1,
        detail={"by": "ping"},
    )
    await events.driver.insert_events(InsertEventsParams([mine], events.now))
    assert await events.expire() == 1
    docs = await listed(events, kinds=["lease_lost"])
    assert [d["detail"]["by"] for d in docs] == ["ping"]


async def test_the_deadline_pass_records_expired(events: Store) -> None:
    deadline = events.at(5)
    await events.add("t", deadline=deadline)
    await events.add("later", deadline=events.at(60))
    events.advance(10)
    assert await events.driver.expire_deadlines(ExpireParams(events.now)) == 1
    assert await events.driver.expire_deadlines(ExpireParams(events.now)) == 0
    (doc,) = await listed(events, kinds=["expired"])
    assert doc["key"] == "t" and doc["detail"]["deadline"] == deadline
    assert await events.status("t") == "expired"


async def test_controls_and_option_changes_are_recorded_when_applied(events: Store) -> None:
    await events.add("t")
    driver = events.driver
    events.advance(1)  # one event per millisecond here: events of one time are listed by id
    assert await driver.control_task(ControlParams("t", "pause", ["pending", "running"], events.now))
    events.advance(1)
    assert await driver.control_task(ControlParams("t", "resume", ["pending", "running"], events.now))
    events.advance(1)
    assert await events.change_option("t", priority=5)
    events.advance(1)
    assert await driver.control_task(
        ControlParams("t", "cancel", ["pending"], events.now, "no longer needed")
    )
    # refused (the task is cancelled now): nothing recorded
    assert not await driver.control_task(ControlParams("t", "pause", ["pending", "running"], events.now))
    events.advance(1)
    assert await driver.control_task(ControlParams("t", "restart", ["cancelled"], events.now))
    events.advance(1)
    assert await driver.control_task(ControlParams("t", "remove", ["pending"], events.now))
    assert not await driver.control_task(ControlParams("gone", "remove", ["pending"], events.now))
    docs = await listed(events, keys=["t"])
    assert kinds(docs) == ["sent", "paused", "resumed", "edited", "cancelled", "restarted", "removed"]
    assert docs[4]["detail"] == {"reason": "no longer needed"}
    assert docs[3]["detail"] == {}  # an edit of unknown author has no detail
    assert all(d["name"] == "job" for d in docs)


async def test_an_edit_names_its_author(events: Store) -> None:
    await events.add("t")
    doc = await events.get("t")
    option = dict(doc["option"]) | {"priority": 9}
    events.advance(1)
    assert await events.driver.update_option(UpdateOptionParams("t", option, events.now, "api:alice"))
    [edited] = await listed(events, keys=["t"], kinds=["edited"])
    assert edited["detail"] == {"by": "api:alice"}


async def test_events_of_a_plan_s_run_task_name_the_plan(events: Store) -> None:
    key = occurrence_key("nightly", events.now)
    await events.add(key)
    await events.add("plain")
    assert [d["key"] for d in await listed(events, plan_ids=["nightly"])] == [key]
    assert {d["plan_id"] for d in await listed(events)} == {"nightly", None}


async def test_a_stream_follows_new_matching_events_or_is_unsupported(events: Store) -> None:
    driver: Driver = events.driver
    await events.add("before")
    try:
        stream = await driver.open_event_stream(EventQuery(kinds=["sent"], names=["job"]))
    except ChangeStreamUnsupported:
        assert not isinstance(driver, MemoryDriver), "the memory driver has streams"
        return
    try:
        await events.add("x", name="other")  # not matching
        await events.add("after")
        iterator = aiter(stream)
        doc = await anext(iterator)
        assert (doc["key"], doc["kind"]) == ("after", "sent")
        token = stream.resume_token
    finally:
        await stream.aclose()
    await events.add("later")
    reopened = await driver.open_event_stream(EventQuery(kinds=["sent"], names=["job"]), token)
    try:
        doc = await anext(aiter(reopened))
        assert doc["key"] == "later"  # resumed after "after": nothing twice, nothing missed
    finally:
        await reopened.aclose()


async def test_the_memory_driver_keeps_the_newest_events_up_to_its_cap() -> None:
    driver = MemoryDriver(events=True, max_events=3)
    for i in range(5):
        await driver.insert_events(
            InsertEventsParams(
                [task_event(WRITER, EventKind.SENT, f"k{i}", "job", driver.clock.now())], driver.clock.now()
            )
        )
    assert [d["key"] for d in await driver.list_events(EventQuery())] == ["k2", "k3", "k4"]
    assert driver.events_dropped == 2


async def test_a_sent_event_names_who_sent_and_says_when_it_reset(events: Store) -> None:
    from mscheduler.drivers.base import InsertParams

    store = events
    await store.driver.insert_tasks(InsertParams([store.task("s")], store.now, by="api:shop"))
    await store.driver.insert_tasks(InsertParams([store.task("anon")], store.now))
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.done(claimed, "w1") is True
    store.advance(1)
    reset = InsertParams([store.task(claimed.key)], store.now, reset_finished=True, by="api:ops")
    assert await store.driver.insert_tasks(reset) == [True]
    sent = [(d["key"], d["detail"]) for d in await listed(store, kinds=["sent"])]
    first = {"s": {"by": "api:shop"}, "anon": {}}
    assert sent[:2] == [("s", first["s"]), ("anon", first["anon"])]
    assert sent[2] == (claimed.key, {"by": "api:ops", "reset": True})
