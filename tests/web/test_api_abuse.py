"""The API under abuse (issue 20, part B): bodies above the cap are a 413 before they are read
whole and change nothing; event streams and long-poll waits are capped per token and in all (429
with ``Retry-After``) and their slots come back however they end; every answer carries
``nosniff`` and ``no-store``; no redirect names the ``Host`` a client sent.

The tests of the defaults use nothing the earlier build lacks, so on it they fail by what it
does (no 413, a tenth stream or a 65th wait that never answers, missing headers), not by an
import."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, Operations, Task
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import ApiTokens, create_app
from tests.web.support import ADMIN, ADMIN_TOKEN, READ, READ_TOKEN, CountingDriver, publisher

EXECUTOR_TOKEN = "executor-token-0123456789abcdef"
OTHER_READ_TOKEN = "second-read-token-9f8e7d6c5b4a"
EXEC = {"Authorization": f"Bearer {EXECUTOR_TOKEN}"}
OTHER_READ = {"Authorization": f"Bearer {OTHER_READ_TOKEN}"}
TOKENS = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN, OTHER_READ_TOKEN], executor=[EXECUTOR_TOKEN])


def _app(driver: CountingDriver, **limits: Any) -> Any:
    operations = Operations(driver, clock=driver.clock)
    executors = RemoteExecutors(driver, clock=driver.clock)
    if not limits:  # the defaults
        return create_app(operations=operations, tokens=TOKENS, executors=executors)
    from mscheduler.web.guards import ApiLimits

    return create_app(operations=operations, tokens=TOKENS, executors=executors, limits=ApiLimits(**limits))


@pytest.fixture
def log_driver() -> CountingDriver:
    return CountingDriver(clock=FakeClock(), events=True)


async def _client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http


# -- 413 ------------------------------------------------------------------------------------------


async def test_a_body_above_the_cap_is_refused_before_it_is_read(driver: CountingDriver) -> None:
    app = _app(driver, max_body_bytes=10_000)
    await publisher(driver).send(Task("t1", "job", None))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        driver.calls.clear()
        big = {"reason": "x" * 20_000}
        response = await http.post("/api/v1/tasks/t1/cancel", json=big, headers=ADMIN)
        assert response.status_code == 413
        assert response.json()["error"] == "payload_too_large"
        assert "10000 bytes" in response.json()["detail"]

        read: list[int] = []

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
            for _ in range(100):
                read.append(1)
                yield b'{"reason": "' + b"y" * 1000

        chunked = await http.post(
            "/api/v1/tasks/t1/cancel",
            content=chunks(),
            headers=ADMIN | {"Content-Type": "application/json"},
        )
        assert chunked.status_code == 413 and chunked.json()["error"] == "payload_too_large"
        assert len(read) < 100  # refused once past the cap, not after the whole body
        assert sum(driver.calls.values()) == 0  # nothing read from or written to the store
        assert (await driver.get_task("t1") or {})["state"]["status"] == "pending"

        under = await http.post("/api/v1/tasks/t1/cancel", json={"reason": "z" * 1500}, headers=ADMIN)
        assert under.status_code == 200


async def test_the_default_cap_lets_a_full_report_through_and_stops_a_huge_one(
    driver: CountingDriver,
) -> None:
    app = _app(driver)
    report = {
        "worker_id": "ex-1",
        "key": "t1",
        "attempt": "a1",
        "outcome": "failed",
        "error": {"type": "E", "message": "m", "traceback": "line\n" * 200_000},  # 1 MB traceback
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/api/v1/executors/report", json=report, headers=EXEC)
        assert response.status_code == 409  # admitted (no such attempt), not refused for its size
        huge = report | {"result": "r" * (5 * 1024 * 1024)}
        refused = await http.post("/api/v1/executors/report", json=huge, headers=EXEC)
        assert refused.status_code == 413


async def test_the_limits_are_checked() -> None:
    from mscheduler.domain.exceptions import InvalidInput
    from mscheduler.web.guards import ApiLimits

    with pytest.raises(InvalidInput, match="max_body_bytes"):
        ApiLimits(max_body_bytes=0)
    with pytest.raises(InvalidInput, match="per-token cap"):
        ApiLimits(streams_per_token=10, streams_total=5)


# -- 429: streams ---------------------------------------------------------------------------------


async def _open_stream(http: httpx.AsyncClient, headers: dict[str, str]) -> asyncio.Task[Any]:
    return asyncio.ensure_future(http.get("/api/v1/events/stream", headers=headers))


async def _until(condition: Any, rounds: int = 10_000, seconds: float = 10.0) -> None:
    """Until ``condition()`` holds: ``rounds`` turns of the loop, then (a loaded machine, where
    opening a stream can take a thread's turn) short naps for up to ``seconds``."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not come true")


async def test_streams_are_capped_per_token_and_in_all_and_their_slots_come_back(
    log_driver: CountingDriver,
) -> None:
    app = _app(log_driver, streams_per_token=2, streams_total=3, retry_after_seconds=7)
    slots = app.state.streams
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        open_ = [await _open_stream(http, READ), await _open_stream(http, READ)]
        await _until(lambda: slots.held() == 2)
        refused = await http.get("/api/v1/events/stream", headers=READ)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "7"
        assert refused.json()["error"] == "too_many_streams"
        assert "per token" in refused.json()["detail"]

        open_.append(await _open_stream(http, OTHER_READ))  # another token: its own share
        await _until(lambda: slots.held() == 3)
        full = await http.get("/api/v1/events/stream", headers=OTHER_READ)
        assert full.status_code == 429 and "in all" in full.json()["detail"]
        # the rest of the API still answers
        assert (await http.get("/api/v1/whoami", headers=READ)).status_code == 200

        for task in open_:
            task.cancel()
        await asyncio.gather(*open_, return_exceptions=True)
        await _until(lambda: slots.held() == 0)
        assert not log_driver._event_streams
        await publisher(log_driver).send(Task("t1", "job", None))  # an event to replay
        since: dict[str, str | int] = {
            "max_events": 1,
            "since": (log_driver.clock.now() - timedelta(seconds=1)).isoformat(),
        }
        again = await http.get("/api/v1/events/stream", headers=READ, params=since)
        assert again.status_code == 200 and "event: sent" in again.text
        await _until(lambda: slots.held() == 0)  # a stream that ended gives its slot back


async def test_by_default_a_token_holds_eight_streams(log_driver: CountingDriver) -> None:
    from mscheduler.drivers.streams import subscriptions

    app = _app(log_driver)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        open_ = [await _open_stream(http, READ) for _ in range(8)]
        await _until(lambda: subscriptions(log_driver, "events") == 8)
        # the process's one stream of the event log serves them all (issue 18.6); the first
        # subscriber opens it in its own task, which may still be on its way
        await _until(lambda: len(log_driver._event_streams) > 0)
        assert len(log_driver._event_streams) == 1
        ninth = await asyncio.wait_for(http.get("/api/v1/events/stream", headers=READ), 5)
        assert ninth.status_code == 429 and ninth.headers["retry-after"] == "5"
        other = await _open_stream(http, OTHER_READ)  # another token still may
        await _until(lambda: subscriptions(log_driver, "events") == 9)
        for task in [*open_, other]:
            task.cancel()
        await asyncio.gather(*open_, other, return_exceptions=True)


# -- 429: waits -----------------------------------------------------------------------------------


async def test_by_default_a_token_has_64_leases_waiting(driver: CountingDriver) -> None:
    app = _app(driver)
    lease = {"names": ["job"], "wait_seconds": 30}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        waiting = [
            asyncio.ensure_future(
                http.post("/api/v1/executors/lease", json=lease | {"worker_id": f"ex-{n}"}, headers=EXEC)
            )
            for n in range(64)
        ]
        for _ in range(20_000):  # until every one of them waits
            await asyncio.sleep(0)
        assert not any(w.done() for w in waiting)
        late = await asyncio.wait_for(
            # a worker id it leases as already: one more id would be refused first (64 per token)
            http.post("/api/v1/executors/lease", json=lease | {"worker_id": "ex-0"}, headers=EXEC),
            5,
        )
        assert late.status_code == 429 and late.json()["error"] == "too_many_waits"
        for w in waiting:
            w.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


async def test_long_poll_waits_are_capped_per_token_and_a_lease_without_wait_still_goes(
    driver: CountingDriver,
) -> None:
    app = _app(driver, waits_per_token=1, waits_total=2)
    waits = app.state.waits
    lease = {"worker_id": "ex-1", "names": ["job"], "wait_seconds": 30}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        waiting = asyncio.ensure_future(http.post("/api/v1/executors/lease", json=lease, headers=EXEC))
        await _until(lambda: waits.held() == 1)
        refused = await http.post("/api/v1/executors/lease", json=lease | {"worker_id": "ex-2"}, headers=EXEC)
        assert refused.status_code == 429 and refused.json()["error"] == "too_many_waits"
        assert int(refused.headers["retry-after"]) >= 1
        now = await http.post(
            "/api/v1/executors/lease", json=lease | {"worker_id": "ex-2", "wait_seconds": 0}, headers=EXEC
        )
        assert now.status_code == 200 and now.json()["tasks"] == []
        other = lease | {"worker_id": "ex-3"}  # another token: its own share
        admin = asyncio.ensure_future(http.post("/api/v1/executors/lease", json=other, headers=ADMIN))
        await _until(lambda: waits.held() == 2)
        third = await http.post("/api/v1/executors/lease", json=lease | {"worker_id": "ex-4"}, headers=READ)
        assert third.status_code == 403  # (a read token may not lease at all)
        await publisher(driver).send_many([Task("t1", "job", None), Task("t2", "job", None)])
        assert (await waiting).status_code == 200 and (await admin).status_code == 200
        assert waits.held() == 0


# -- headers --------------------------------------------------------------------------------------


async def test_every_api_answer_says_nosniff_and_no_store(client: httpx.AsyncClient) -> None:
    for path, headers in (
        ("/api/v1/tasks", ADMIN),
        ("/api/v1/tasks/nope", ADMIN),
        ("/api/v1/tasks", {}),  # 401
        ("/api/v1/tasks?status=nope", ADMIN),  # 422
        ("/api/v1/health", {}),
        ("/api/v1/openapi.json", {}),
        ("/api/v1/nothing", ADMIN),
    ):
        response = await client.get(path, headers=headers)
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["cache-control"] == "no-store", path
    page = await client.get("/ui/")
    assert page.headers["cache-control"] == "no-cache"  # the dashboard's files: revalidated


async def test_no_redirect_names_the_host_the_client_sent(client: httpx.AsyncClient) -> None:
    evil = {"Host": "evil.example"}
    for path in ("/ui", "/"):
        response = await client.get(path, headers=evil)
        assert response.status_code == 307, path
        assert response.headers["location"] == "ui/", path  # relative: works under a mount too
    # any absolute Location the framework builds (its slash redirects use the Host header) is cut
    # to its path on the way out
    from mscheduler.web.guards import _relative

    assert _relative(b"http://evil.example/ui/?a=1") == b"/ui/?a=1"
    assert _relative(b"https://evil.example//other.example/x") == b"/other.example/x"
    assert _relative(b"ui/") == b"ui/"


# -- no per-request recomputation ------------------------------------------------------------------


async def test_stats_are_computed_once_for_many_clients_and_again_after_the_cache_time(
    driver: CountingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(driver, stats_cache_seconds=60)
    operations = app.state.operations
    computed = 0
    real = operations.stats

    async def counted(**kwargs: Any) -> Any:
        nonlocal computed
        computed += 1
        await asyncio.sleep(0.01)  # long enough for the others to ask meanwhile
        return await real(**kwargs)

    monkeypatch.setattr(operations, "stats", counted)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        answers = await asyncio.gather(*(http.get("/api/v1/stats", headers=READ) for _ in range(20)))
        assert {a.status_code for a in answers} == {200} and computed == 1
        assert len({a.text for a in answers}) == 1
        assert (await http.get("/api/v1/stats", params={"window": 600}, headers=READ)).status_code == 200
        assert computed == 2  # another window: its own answer
    fresh = _app(driver, stats_cache_seconds=0)
    monkeypatch.setattr(fresh.state.operations, "stats", counted)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fresh), base_url="http://test") as http:
        for _ in range(3):
            await http.get("/api/v1/stats", headers=READ)
    assert computed == 5
