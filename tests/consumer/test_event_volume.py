"""The event log under volume: a subscriber's de-duplication costs O(1) per event and holds a
bounded set, a replay hands events out a page at a time (the event loop runs between pages, and
nothing holds the whole replay), ``since`` reaches back at most ``max_replay``, and the memory
driver reads a page of the log without scanning all of it.

Counted, not timed: what the loop did between two of its turns, how large the structures grew,
how many stored events a read looked at."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import mscheduler.drivers.memory.events as memory_events
from mscheduler import Events, FakeClock, InvalidInput, MemoryDriver
from mscheduler.domain.events import EventKind, EventWriter, event_doc
from mscheduler.domain.events import matches as matches_query
from mscheduler.drivers.base import EventQuery, InsertEventsParams
from mscheduler.services import events as events_service

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def filled(count: int, *, batch: int = 250, step_ms: int = 1) -> tuple[MemoryDriver, FakeClock]:
    """A memory store whose log holds ``count`` events, ``batch`` per insert, stored one
    millisecond apart (all within the last few seconds of the clock)."""
    clock = FakeClock(T0)
    driver = MemoryDriver(events=True, clock=clock, max_events=max(count, 1000))
    writer = EventWriter()
    for start in range(0, count, batch):
        docs = [
            event_doc(EventKind.SENT, f"k{i}", "job", clock.now(), writer=writer)
            for i in range(start, min(start + batch, count))
        ]
        await driver.insert_events(InsertEventsParams(docs, clock.now()))
        clock.advance(step_ms / 1000)
    return driver, clock


def test_de_duplication_holds_a_bounded_set_and_forgets_oldest_first() -> None:
    seen = events_service._Seen(timedelta(seconds=30), cap=1000)
    for i in range(20_000):  # all inside the overlap: only the cap bounds them
        assert seen.first({"id": f"e{i}", "written": T0 + timedelta(microseconds=i)})
    assert len(seen.ids) <= 1000
    assert not seen.first({"id": "e19999", "written": T0})  # the newest are remembered
    assert seen.first({"id": "e0", "written": T0})  # the oldest went first
    # past the overlap, ids leave with time, not only with the cap
    seen.first({"id": "late", "written": T0 + timedelta(seconds=31)})
    assert seen.ids == {"late"}


async def test_a_replay_lets_the_loop_run_between_pages_and_holds_a_page(monkeypatch: Any) -> None:
    # stored a page's worth at a time: a stored instant's events are handed out together
    driver, clock = await filled(12_000, batch=events_service.POLL_PAGE)
    pages: list[int] = []
    list_events = driver.list_events

    async def counting(query: EventQuery) -> list[dict[str, Any]]:
        found = await list_events(query)
        pages.append(len(found))
        return found

    monkeypatch.setattr(driver, "list_events", counting)
    turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:  # one turn of the loop per iteration: counts what ran between
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    events = Events(driver, clock=clock)
    tick = asyncio.create_task(ticker())
    since_tick: list[int] = []
    last_turn, run = turns, 0
    got = 0
    source = events.subscribe(since=T0)
    async for _ in source:
        got += 1
        if turns != last_turn:
            since_tick.append(run)
            last_turn, run = turns, 0
        run += 1
        if got == 12_000:
            break
    await source.aclose()  # type: ignore[attr-defined]
    stop.set()
    await tick
    assert got == 12_000
    assert max(pages) <= events_service.POLL_PAGE
    # events handed out without the loop turning: about a page, never the whole replay
    assert max([*since_tick, run]) <= 2 * events_service.POLL_PAGE


async def test_a_replay_of_a_crowded_instant_keeps_the_order_events_happened() -> None:
    clock = FakeClock(T0)
    driver = MemoryDriver(events=True, clock=clock)
    writer = EventWriter()
    # one consumer batch: stored at one instant, happened in another order than their ids say
    docs = [
        event_doc(EventKind.SENT, f"k{i:04}", "job", T0 - timedelta(milliseconds=1200 - i), writer=writer)
        for i in range(1200)
    ]
    docs.reverse()
    await driver.insert_events(InsertEventsParams(docs, T0))
    events = Events(driver, clock=clock)
    source = events.subscribe(since=T0)
    got = []
    async for event in source:
        got.append(event.time)
        if len(got) == 1200:
            break
    await source.aclose()  # type: ignore[attr-defined]
    assert got == sorted(got)


async def test_since_reaches_back_at_most_max_replay() -> None:
    driver, clock = await filled(10)
    events = Events(driver, clock=clock, max_replay=60)
    with pytest.raises(InvalidInput, match="since: at most 60 seconds back"):
        events.subscribe(since=clock.now() - timedelta(seconds=61))
    events.subscribe(since=clock.now() - timedelta(seconds=59))  # within: accepted
    with pytest.raises(InvalidInput, match="max_replay"):
        Events(driver, max_replay=0)


async def test_a_page_by_stored_time_reads_the_page_not_the_log(monkeypatch: Any) -> None:
    driver, _ = await filled(20_000)
    looked = 0
    matches = matches_query  # what the memory driver's reads call

    def counting(doc: Any, query: Any) -> bool:
        nonlocal looked
        looked += 1
        return matches(doc, query)

    monkeypatch.setattr(memory_events, "matches", counting)
    first = await driver.list_events(EventQuery(written_from=T0, by_written=True, limit=500))
    looked_first, looked = looked, 0
    last = first[-1]
    second = await driver.list_events(
        EventQuery(written_from=T0, after=(last["written"], last["id"]), by_written=True, limit=500)
    )
    assert looked_first == 500 and looked == 500
    assert [d["id"] for d in second] == [d["id"] for d in stored_order(driver)[500:1000]]
    history = await driver.list_events(EventQuery(keys=["k7"], limit=10))
    assert [d["key"] for d in history] == ["k7"] and looked <= 501  # one key's events only


def stored_order(driver: MemoryDriver) -> list[dict[str, Any]]:
    """The log in (written, id) order, read the slow way."""
    return sorted(driver.stored_events(), key=lambda d: (d["written"], d["id"]))
