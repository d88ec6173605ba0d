"""The event log over HTTP: ``GET /api/v1/events`` (filters, paging, bad input refused before any
read) and ``GET /api/v1/events/stream`` (server-sent events: replay, live events, resume with
``Last-Event-ID``, the subscription closed when the client goes away); both a clear 409 when the
store's log is off. And ``GET /metrics`` (read token, or public when asked; off on request)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, Operations, Task
from mscheduler.web import create_app
from mscheduler.web.routes.events import EVENT_LOG_OFF, parse_sse_id
from tests.web.support import ADMIN, READ, TOKENS, CountingDriver, client_for, publisher, tick


@pytest.fixture
def log_driver() -> CountingDriver:
    return CountingDriver(clock=FakeClock(), events=True)


@pytest.fixture
async def log_client(log_driver: CountingDriver) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(Operations(log_driver, clock=log_driver.clock)) as http:
        yield http


async def _send(driver: CountingDriver, *keys: str, name: str = "job") -> None:
    for key in keys:
        await publisher(driver).send(Task(key, name, {"n": 1}))
        tick(driver)


def _messages(text: str) -> list[dict[str, str]]:
    """The server-sent events of a body (comment lines left out)."""
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            found.append(fields)
    return found


async def test_events_are_listed_in_time_order_with_filters_and_paging(
    log_driver: CountingDriver, log_client: httpx.AsyncClient
) -> None:
    await _send(log_driver, "a", "b", "c")
    await _send(log_driver, "m", name="mail")
    await Operations(log_driver, clock=log_driver.clock).cancel("b", "no longer needed")

    page = await log_client.get("/api/v1/events", headers=READ, params={"limit": 2})
    assert page.status_code == 200
    body = page.json()
    assert [(e["key"], e["kind"]) for e in body["events"]] == [("a", "sent"), ("b", "sent")]
    assert body["next_skip"] == 2
    rest = (await log_client.get("/api/v1/events", headers=READ, params={"skip": 2})).json()
    assert [(e["key"], e["kind"]) for e in rest["events"]] == [
        ("c", "sent"),
        ("m", "sent"),
        ("b", "cancelled"),
    ]
    assert rest["next_skip"] is None

    one = await log_client.get("/api/v1/events", headers=READ, params={"key": "b"})
    assert [e["kind"] for e in one.json()["events"]] == ["sent", "cancelled"]
    assert one.json()["events"][1]["detail"]["reason"] == "no longer needed"
    kinds = await log_client.get("/api/v1/events", headers=READ, params={"kinds": "cancelled, paused"})
    assert [e["key"] for e in kinds.json()["events"]] == ["b"]
    named = await log_client.get("/api/v1/events", headers=READ, params={"name": "mail"})
    assert [e["key"] for e in named.json()["events"]] == ["m"]

    times = [e["time"] for e in rest["events"]]
    window = await log_client.get(
        "/api/v1/events", headers=READ, params={"since": times[0], "until": times[2]}
    )
    assert [e["key"] for e in window.json()["events"]] == ["c", "m"]


@pytest.mark.parametrize(
    "params",
    [
        {"kinds": "sent,exploded"},
        {"kinds": ","},
        {"key": "a\x00"},
        {"name": "$where"},
        {"plan": "$gt"},
        {"since": "yesterday"},
        {"since": "2030-01-01T00:00:00"},
        {"limit": "0"},
        {"kinds[$ne]": "sent"},
    ],
    ids=[
        "unknown-kind",
        "no-kind",
        "nul-key",
        "bad-name",
        "bad-plan",
        "not-a-time",
        "naive",
        "limit",
        "operator",
    ],
)
async def test_bad_filters_are_422_and_nothing_is_read(
    log_driver: CountingDriver, log_client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    reads = 0

    async def counted(query: Any) -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        return []

    log_driver.list_events = counted  # type: ignore[method-assign]
    for path in ("/api/v1/events", "/api/v1/events/stream"):
        response = await log_client.get(path, headers=READ, params=params)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["error"] == "invalid_input"
    assert reads == 0


async def test_with_the_log_off_both_routes_say_so(client: httpx.AsyncClient) -> None:
    for path in ("/api/v1/events", "/api/v1/events/stream"):
        response = await client.get(path, headers=READ)
        assert response.status_code == 409
        assert response.json() == {"error": "event_log_off", "detail": EVENT_LOG_OFF}


async def test_events_need_a_token(log_client: httpx.AsyncClient) -> None:
    for path in ("/api/v1/events", "/api/v1/events/stream"):
        assert (await log_client.get(path)).status_code == 401


async def test_the_stream_replays_since_a_time_and_resumes_after_the_last_event_id(
    log_driver: CountingDriver, log_client: httpx.AsyncClient
) -> None:
    start = log_driver.clock.now().isoformat()
    await _send(log_driver, "a", "b", "c")

    response = await log_client.get(
        "/api/v1/events/stream", headers=READ, params={"since": start, "max_events": 2}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    first = _messages(response.text)
    assert [(m["event"], json.loads(m["data"])["key"]) for m in first] == [("sent", "a"), ("sent", "b")]
    assert parse_sse_id(first[1]["id"])[1] == json.loads(first[1]["data"])["id"]

    resumed = await log_client.get(
        "/api/v1/events/stream",
        headers=READ | {"Last-Event-ID": first[1]["id"]},
        params={"max_events": 1},
    )
    assert [json.loads(m["data"])["key"] for m in _messages(resumed.text)] == ["c"]

    bad = await log_client.get("/api/v1/events/stream", headers=READ | {"Last-Event-ID": "42"})
    assert bad.status_code == 422


async def test_the_stream_reaches_back_at_most_the_replay_limit(log_driver: CountingDriver) -> None:
    from mscheduler.web.guards import ApiLimits

    await _send(log_driver, "a")
    app = create_app(
        operations=Operations(log_driver, clock=log_driver.clock),
        tokens=TOKENS,
        limits=ApiLimits(replay_seconds=60),
    )
    old = (log_driver.clock.now() - timedelta(seconds=61)).isoformat()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        refused = await http.get("/api/v1/events/stream", headers=READ, params={"since": old})
        assert refused.status_code == 422
        assert "since: at most 60 seconds back" in refused.json()["detail"]
        stale_id = f"{old}/anything"
        resumed = await http.get("/api/v1/events/stream", headers=READ | {"Last-Event-ID": stale_id})
        assert resumed.status_code == 422
        recent = (log_driver.clock.now() - timedelta(seconds=59)).isoformat()
        ok = await http.get("/api/v1/events/stream", headers=READ, params={"since": recent, "max_events": 1})
        assert [json.loads(m["data"])["key"] for m in _messages(ok.text)] == ["a"]


async def test_the_stream_tells_new_events_as_they_are_stored(
    log_driver: CountingDriver, log_client: httpx.AsyncClient
) -> None:
    await _send(log_driver, "old")
    request = asyncio.create_task(
        log_client.get("/api/v1/events/stream", headers=READ, params={"kinds": "cancelled", "max_events": 1})
    )
    for _ in range(10_000):  # until the subscription is open: what follows is new
        if log_driver._event_streams:
            break
        await asyncio.sleep(0)
    assert log_driver._event_streams
    await _send(log_driver, "new")
    await Operations(log_driver, clock=log_driver.clock).cancel("new")
    response = await request
    [message] = _messages(response.text)
    assert message["event"] == "cancelled"
    assert json.loads(message["data"])["key"] == "new"
    assert not log_driver._event_streams  # closed when the response ended


async def test_a_client_that_goes_away_closes_its_subscription(log_driver: CountingDriver) -> None:
    app = create_app(operations=Operations(log_driver, clock=log_driver.clock), tokens=TOKENS)
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()  # the client reads the first bytes and hangs up

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/v1/events/stream",
        "raw_path": b"/api/v1/events/stream",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"authorization", READ["Authorization"].encode()), (b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 30)  # type: ignore[arg-type]  # returns: given up
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    from mscheduler.web.routes.events import _CLOSING

    await asyncio.gather(*list(_CLOSING))  # the subscription is closed in its own task
    assert not log_driver._event_streams


# -- /metrics -------------------------------------------------------------------------------------


async def test_metrics_are_served_to_a_read_token(
    log_driver: CountingDriver, log_client: httpx.AsyncClient
) -> None:
    await _send(log_driver, "a", "b")
    assert (await log_client.get("/metrics")).status_code == 401
    response = await log_client.get("/metrics", headers=READ)
    assert response.status_code == 200
    assert 'mscheduler_tasks{name="job",status="pending"} 2.0' in response.text
    assert (await log_client.post("/metrics", headers=ADMIN)).status_code == 405


async def test_metrics_may_be_public_or_off(log_driver: CountingDriver) -> None:
    operations = Operations(log_driver, clock=log_driver.clock)
    public = create_app(operations=operations, tokens=TOKENS, metrics_public=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=public), base_url="http://t") as http:
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/api/v1/tasks")).status_code == 401  # the API still needs a token
    off = create_app(operations=operations, tokens=TOKENS, metrics=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=off), base_url="http://t") as http:
        assert (await http.get("/metrics", headers=READ)).status_code == 404
    assert "/metrics" not in public.openapi()["paths"]


async def test_a_client_that_goes_away_during_a_flood_of_events_is_let_go(log_driver: CountingDriver) -> None:
    """Under a steady flow of events the stream's queue is never empty: ``asyncio.wait_for`` on
    Python 3.11 then swallowed the cancellation the client's departure causes, and the stream
    ran on — its subscription and its slot with it — for as long as events came (a real
    server: uvicorn on loopback, a real client that reads a little and hangs up)."""
    import socket

    import uvicorn

    app = create_app(operations=Operations(log_driver, clock=log_driver.clock), tokens=TOKENS)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    stop = asyncio.Event()

    async def flood() -> None:
        n = 0
        while not stop.is_set():
            await publisher(log_driver).send_many([Task(f"f{n}-{i}", "job", None) for i in range(20)])
            n += 1
            await asyncio.sleep(0.001)

    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
            await asyncio.sleep(0.01)
        flooding = asyncio.ensure_future(flood())
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(3):
                async with http.stream("GET", "/api/v1/events/stream", headers=READ, timeout=None) as r:
                    assert r.status_code == 200
                    lines = 0
                    async for _line in r.aiter_lines():
                        lines += 1
                        if lines == 50:
                            break  # hang up while events keep coming
        for _ in range(500):  # let the server see the three clients gone (a few ms each)
            if app.state.streams.held() == 0 and not log_driver._event_streams:
                break
            await asyncio.sleep(0.01)
        assert app.state.streams.held() == 0 and not log_driver._event_streams
        assert not flooding.done()  # events were still coming when they were let go
    finally:
        stop.set()
        server.should_exit = True
        await serving
        sock.close()
