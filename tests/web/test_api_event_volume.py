"""The event stream under volume, a small case of ``benchmarks/events_volume.py``: three streams
replay a log of 6,000 events and one follows it live while a publish token sends 1,000 tasks.
Each stream gets every event once, and the work is cut into small pieces: the store is read a
page at a time with the loop turning between pages, a batch of tasks is inserted a part at a
time, and events go out many to a write. Counted (reads per turn of the loop, events per write),
never timed."""

from __future__ import annotations

import asyncio
import importlib
import json
from datetime import timedelta
from typing import Any

import httpx

from mscheduler import FakeClock, MemoryDriver, Operations
from mscheduler.domain.events import EventKind, EventWriter, event_doc
from mscheduler.drivers.base import EventQuery, InsertEventsParams, InsertParams
from mscheduler.drivers.streams import subscriptions
from mscheduler.web import ApiTokens, create_app

ADMIN = "volume-admin-token-0123456789abcdef"
PUBLISH = "volume-publish-token-0123456789abcd"
READERS = [f"volume-read-{n}-token-0123456789abcdef" for n in range(4)]
OLD = 6_000
BURST = 1_000


async def test_replays_and_a_live_stream_during_a_burst_get_every_event_once_in_small_pieces(
    monkeypatch: Any,
) -> None:
    clock = FakeClock()
    driver = MemoryDriver(events=True, clock=clock)
    writer = EventWriter()
    start = clock.now()
    for first in range(0, OLD, 500):
        docs = [
            event_doc(EventKind.SENT, f"old-{i}", "job", clock.now(), writer=writer)
            for i in range(first, first + 500)
        ]
        await driver.insert_events(InsertEventsParams(docs, clock.now()))
        clock.advance(0.001)

    turn = 0
    reads_in_turn: dict[int, int] = {}
    inserts_in_turn: dict[int, int] = {}
    list_events, insert_tasks = driver.list_events, driver.insert_tasks

    async def counted_list(query: EventQuery) -> list[dict[str, Any]]:
        reads_in_turn[turn] = reads_in_turn.get(turn, 0) + 1
        return await list_events(query)

    async def counted_insert(params: InsertParams) -> list[bool]:
        inserts_in_turn[turn] = inserts_in_turn.get(turn, 0) + len(params.tasks)
        return await insert_tasks(params)

    monkeypatch.setattr(driver, "list_events", counted_list)
    monkeypatch.setattr(driver, "insert_tasks", counted_insert)
    writes: list[int] = []
    event_routes = importlib.import_module(
        "mscheduler.web.routes.events"
    )  # (the package names its router so)
    sse = event_routes._sse

    async def counted_sse(*args: Any, **kwargs: Any) -> Any:
        async for text in sse(*args, **kwargs):
            writes.append(text.count("\nevent: "))
            yield text

    monkeypatch.setattr(event_routes, "_sse", counted_sse)
    tokens = ApiTokens(admin=[ADMIN], read=READERS, publish=[PUBLISH])
    app = create_app(operations=Operations(driver, clock=clock), tokens=tokens)
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal turn
        while not stop.is_set():
            turn += 1
            await asyncio.sleep(0)

    async def stream(http: httpx.AsyncClient, token: str, params: dict[str, Any]) -> list[str]:
        answer = await http.get(
            "/api/v1/events/stream", headers={"Authorization": f"Bearer {token}"}, params=params
        )
        assert answer.status_code == 200, answer.text
        return [json.loads(line[6:])["key"] for line in answer.text.splitlines() if line.startswith("data: ")]

    async def burst(http: httpx.AsyncClient) -> None:
        tasks = [{"key": f"new-{i}", "name": "job"} for i in range(BURST)]
        sent = await http.post(
            "/api/v1/tasks?allow_unknown=true",  # the burst's consumer is the test's reads
            headers={"Authorization": f"Bearer {PUBLISH}"},
            json={"tasks": tasks},
        )
        assert sent.status_code == 201, sent.text

    transport = httpx.ASGITransport(app=app)
    tick = asyncio.create_task(ticker())
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as http:
        since = (start - timedelta(milliseconds=1)).isoformat()
        replays = [
            asyncio.create_task(stream(http, token, {"since": since, "max_events": OLD + BURST}))
            for token in READERS[:3]
        ]
        live = asyncio.create_task(stream(http, READERS[3], {"max_events": BURST}))
        for _ in range(1_000_000):  # until all four are subscribed: what follows is new to the live one
            if subscriptions(driver, "events") == 4:
                break
            await asyncio.sleep(0)
        assert subscriptions(driver, "events") == 4
        await burst(http)
        got = await asyncio.wait_for(asyncio.gather(*replays, live), 60)
    stop.set()
    await tick

    expected_old = [f"old-{i}" for i in range(OLD)]
    expected_new = [f"new-{i}" for i in range(BURST)]
    for keys in got[:3]:
        assert sorted(keys) == sorted(expected_old + expected_new)  # each event once, none lost
        assert keys[:OLD] == expected_old  # the log in the order it was stored
    assert got[3] == expected_new
    # the loop turned between the pages of a replay: a turn saw at most one page per replay
    assert max(reads_in_turn.values()) <= 3
    # a batch of 1,000 tasks was inserted a part at a time
    assert max(inserts_in_turn.values()) <= 200
    # events went out many to a write (the replays: a write per batch, not per event)
    assert sum(writes) >= 3 * (OLD + BURST) + BURST
    assert len(writes) < sum(writes) / 5
