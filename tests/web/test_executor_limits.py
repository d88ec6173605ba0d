"""Remote executors under flow limits (SPEC G5 through F30): a lease of limited names takes the
limit's slots as a consumer's claim does, a ping extends them before the leases, a report releases
them, a dead executor's slot comes back when its lease ends, and all of it holds when an
executor's requests reach different API servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, Operations, Task, TaskOption
from mscheduler.drivers.base import SlotsParams
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import ApiTokens, create_app
from tests.consumer.support import FreezableDriver
from tests.helpers import wait_until
from tests.web.support import ADMIN, ADMIN_TOKEN, READ_TOKEN, CountingDriver, publisher

EXECUTOR_TOKEN = "executor-token-0123456789abcdef"
EXEC = {"Authorization": f"Bearer {EXECUTOR_TOKEN}"}
TOKENS = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN], executor=[EXECUTOR_TOKEN])
LEASE, PING, REPORT = "/api/v1/executors/lease", "/api/v1/executors/ping", "/api/v1/executors/report"


def server(operations: Operations) -> tuple[httpx.AsyncClient, RemoteExecutors]:
    """One API server over the shared store (its own limiter, caches and finisher)."""
    service = RemoteExecutors(operations.driver, clock=operations.clock, limit_backoff=0.2)
    app = create_app(operations=operations, tokens=TOKENS, executors=service)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test"), service


@pytest.fixture
async def api(operations: Operations) -> AsyncIterator[tuple[httpx.AsyncClient, RemoteExecutors]]:
    http, service = server(operations)
    async with http:
        yield http, service


@pytest.fixture
def clock(driver: CountingDriver) -> FakeClock:
    assert isinstance(driver.clock, FakeClock)
    return driver.clock


async def settle(rounds: int = 200) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def lease(http: httpx.AsyncClient, worker_id: str = "ex-1", **more: Any) -> list[dict[str, Any]]:
    body = {"worker_id": worker_id, "names": ["job"]} | more
    response = await http.post(LEASE, json=body, headers=EXEC)
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


async def ping(http: httpx.AsyncClient, worker_id: str, *tasks: dict[str, Any]) -> list[dict[str, Any]]:
    body = {"worker_id": worker_id, "tasks": [{"key": t["key"], "attempt": t["attempt"]} for t in tasks]}
    response = await http.post(PING, json=body, headers=EXEC)
    assert response.status_code == 200, response.text
    answers: list[dict[str, Any]] = response.json()["tasks"]
    return answers


async def succeed(http: httpx.AsyncClient, worker_id: str, task: dict[str, Any]) -> None:
    body = {"worker_id": worker_id, "key": task["key"], "attempt": task["attempt"], "outcome": "succeeded"}
    response = await http.post(REPORT, json=body, headers=EXEC)
    assert response.status_code == 200, response.text


async def holders(http: httpx.AsyncClient, key: str = "k") -> list[tuple[str, str]]:
    """(worker id, attempt) of the limit's live slots, as the store has them."""
    limit = (await http.get(f"/api/v1/limits/{key}", headers=ADMIN)).json()
    return sorted((h["worker_id"], h["attempt"]) for h in limit["holders"])


async def test_a_lease_takes_slots_up_to_max_running_and_leases_other_names_as_before(
    api: tuple[httpx.AsyncClient, RemoteExecutors], driver: CountingDriver, operations: Operations
) -> None:
    http, service = api
    await operations.set_limit("k", names=["job"], max_running=2)
    await publisher(driver).send_many(
        [Task(f"j{n}", "job", None) for n in range(4)] + [Task("free", "other")]
    )
    got = await lease(http, "ex-1", names=["job", "other"], max_tasks=4)
    limited = [t for t in got if t["name"] == "job"]
    assert len(limited) == 2 and [t["key"] for t in got if t["name"] == "other"] == ["free"]
    assert await holders(http) == sorted(("ex-1", t["attempt"]) for t in limited)

    assert await lease(http, "ex-2", max_tasks=3) == []  # full: across executors
    assert service.limiter.wait_until  # the refusal backs this name off

    await succeed(http, "ex-1", limited[0])
    left = [("ex-1", limited[1]["attempt"])]

    async def released() -> bool:  # the release rides the finisher's next turn
        return await holders(http) == left

    await wait_until(released, what=f"the holders to be {left}")
    [next_one] = await lease(http, "ex-2", max_tasks=3)  # a freed slot: asked again at once
    assert next_one["key"] not in {t["key"] for t in limited}
    assert await holders(http) == sorted([("ex-1", limited[1]["attempt"]), ("ex-2", next_one["attempt"])])


async def test_a_long_poll_waits_while_the_limit_is_full_and_wakes_when_a_slot_frees(
    api: tuple[httpx.AsyncClient, RemoteExecutors],
    driver: CountingDriver,
    operations: Operations,
    clock: FakeClock,
) -> None:
    http, service = api
    await operations.set_limit("k", names=["job"], max_running=1)
    await publisher(driver).send_many([Task("a", "job"), Task("b", "job")])
    [first] = await lease(http, "ex-1")
    waiting = asyncio.ensure_future(lease(http, "ex-2", wait_seconds=20))
    for _ in range(12):  # backoff rounds: asked again, still full
        clock.advance(0.25)
        await settle()
    assert not waiting.done()
    acquires = service.limiter.commands["acquire"]
    assert acquires >= 3  # it re-checked after each backoff, not only at the end

    await succeed(http, "ex-1", first)  # through the same server: wakes the waiting lease
    await wait_until(waiting.done, what="the waiting lease to wake")  # no fake time passes
    [second] = waiting.result()
    assert second["key"] == "b" and await holders(http) == [("ex-2", second["attempt"])]


async def test_a_long_poll_on_a_full_limit_ends_at_its_wait_and_other_names_go_on(
    api: tuple[httpx.AsyncClient, RemoteExecutors],
    driver: CountingDriver,
    operations: Operations,
    clock: FakeClock,
) -> None:
    http, _ = api
    await operations.set_limit("k", names=["job"], max_running=1)
    await publisher(driver).send_many([Task("a", "job"), Task("b", "job")])
    await lease(http, "ex-1")
    waiting = asyncio.ensure_future(lease(http, "ex-2", names=["job", "other"], wait_seconds=3))
    await settle()
    await publisher(driver).send(Task("o1", "other"))
    await wait_until(waiting.done, what="the lease of another name to return")
    assert [t["key"] for t in waiting.result()] == ["o1"]  # not held up by the full limit
    empty = asyncio.ensure_future(lease(http, "ex-2", wait_seconds=3))
    for _ in range(16):
        clock.advance(0.25)
        await settle()
    assert empty.done() and empty.result() == []


async def test_a_rate_limit_is_honoured_by_executors(
    api: tuple[httpx.AsyncClient, RemoteExecutors],
    driver: CountingDriver,
    operations: Operations,
    clock: FakeClock,
) -> None:
    http, _ = api
    await operations.set_limit("k", names=["job"], rate="2/10s")
    await publisher(driver).send_many([Task(f"j{n}", "job", None) for n in range(5)])
    assert len(await lease(http, "ex-1", max_tasks=5)) == 2
    assert await lease(http, "ex-2", max_tasks=5) == []
    waiting = asyncio.ensure_future(lease(http, "ex-2", max_tasks=5, wait_seconds=20))
    for _ in range(39):
        clock.advance(0.25)
        await settle()
    assert not waiting.done()  # 9.75 s: the window still holds two starts
    # starts are counted per bucket of period / 1000 (10 ms here): the window frees them at most
    # one bucket after the exact sliding window would (never before)
    clock.advance(0.25 + 0.01)
    await wait_until(waiting.done, what="the window to free its starts")
    assert len(waiting.result()) == 2  # woken when the window frees its starts
    docs = [await driver.get_task(f"j{n}") for n in range(5)]
    times = sorted(e["start_time"] for d in docs if d for e in d["state"]["worker_states"])
    assert len(times) == 4
    assert all(times[i + 2] - times[i] >= timedelta(seconds=10) for i in range(len(times) - 2))


async def test_the_first_lease_of_a_limited_task_is_capped_and_pinged_in_time(
    api: tuple[httpx.AsyncClient, RemoteExecutors], driver: CountingDriver, operations: Operations
) -> None:
    http, _ = api
    await operations.set_limit("k", names=["job"], max_running=5)
    option = TaskOption(ping_interval=timedelta(seconds=60), worker_timeout=timedelta(seconds=120))
    await publisher(driver).send_many(
        [Task("long", "job", option=option), Task("free", "other", option=option)]
    )
    [capped] = await lease(http, "ex-1")
    # the slot's lease (30 s) caps the first lease; the answer says to ping within a third of it
    assert (capped["first_lease_seconds"], capped["lease_seconds"], capped["ping_interval_seconds"]) == (
        30.0,
        120.0,
        10.0,
    )
    [free] = await lease(http, "ex-1", names=["other"])
    assert (free["first_lease_seconds"], free["ping_interval_seconds"]) == (120.0, 60.0)


async def test_a_ping_extends_the_slot_and_an_attempt_whose_slot_is_gone_is_lost(
    api: tuple[httpx.AsyncClient, RemoteExecutors],
    driver: CountingDriver,
    operations: Operations,
    clock: FakeClock,
) -> None:
    http, _ = api
    await operations.set_limit("k", names=["job"], max_running=2)
    await publisher(driver).send_many([Task("a", "job"), Task("b", "job")])
    a, b = await lease(http, "ex-1", max_tasks=2)
    clock.advance(10)
    answers = await ping(http, "ex-1", a, b)
    assert [x["state"] for x in answers] == ["alive", "alive"]
    limit = (await http.get("/api/v1/limits/k", headers=ADMIN)).json()
    assert {h["expire_time"] for h in limit["holders"]} == {x["lease_expires"] for x in answers}

    # b's slot goes (as if released through another server): its lease is not renewed
    await driver.update_slots(SlotsParams("k", "ex-1", clock.now(), release=[b["attempt"]]))
    expire_before = (await driver.get_task("b"))["state"]["worker_states"][0]["ping_expire_time"]  # type: ignore[index]
    clock.advance(10)
    answers = await ping(http, "ex-1", a, b)
    assert [(x["key"], x["state"]) for x in answers] == [("a", "alive"), ("b", "lost")]
    assert answers[1]["lease_expires"] is None
    entry = (await driver.get_task("b"))["state"]["worker_states"][0]  # type: ignore[index]
    assert entry["ping_expire_time"] == expire_before  # not renewed: it runs out, then b is claimable


async def test_a_dead_executor_gives_its_slot_back_when_its_lease_ends(
    api: tuple[httpx.AsyncClient, RemoteExecutors],
    driver: CountingDriver,
    operations: Operations,
    clock: FakeClock,
) -> None:
    http, _ = api
    await operations.set_limit("k", names=["job"], max_running=1)
    option = TaskOption(ping_interval=timedelta(seconds=2), worker_timeout=timedelta(seconds=6))
    await publisher(driver).send_many([Task("a", "job", option=option), Task("b", "job", option=option)])
    [dead] = await lease(http, "ex-dead")  # then nothing: no ping, no report
    clock.advance(5.9)
    assert await lease(http, "ex-2") == []
    assert await holders(http) == [("ex-dead", dead["attempt"])]
    clock.advance(0.1)  # the lease, and the slot shortened to it, end together
    assert await holders(http) == []
    clock.advance(0.3)  # past ex-2's backoff after the refusal at 5.9 s
    got = await lease(http, "ex-2", max_tasks=2)
    assert len(got) == 1 and await holders(http) == [("ex-2", got[0]["attempt"])]


async def test_pings_and_reports_reaching_another_server_keep_the_slot_rules(
    api: tuple[httpx.AsyncClient, RemoteExecutors],
    driver: CountingDriver,
    operations: Operations,
    clock: FakeClock,
) -> None:
    """The lease through one server, the ping and the report through another that never saw the
    attempt: it finds the slot in the store (not in its memory), extends it with the lease, and
    releases it with the outcome. A limit added after an unlimited lease does not make the other
    server treat that attempt as slot-less-hence-lost."""
    first, _ = api
    second, service_b = server(operations)
    async with second:
        await publisher(driver).send(Task("early", "job"))
        [early] = await lease(first, "ex-1")  # no limit yet: no slot
        await operations.set_limit("k", names=["job"], max_running=1)
        await publisher(driver).send(Task("late", "job"))
        clock.advance(2)  # the first server re-reads which names are limited
        [late] = await lease(first, "ex-1")
        assert await holders(first) == [("ex-1", late["attempt"])]

        clock.advance(5)
        answers = await ping(second, "ex-1", early, late)
        assert [x["state"] for x in answers] == ["alive", "alive"]
        limit = (await second.get("/api/v1/limits/k", headers=ADMIN)).json()
        assert [h["expire_time"] for h in limit["holders"]] == [answers[1]["lease_expires"]]

        await succeed(second, "ex-1", late)

        async def released() -> bool:
            return await holders(first) == []

        await wait_until(released, what="the slot to be released")
        assert service_b.limiter.commands["release"] == 1


async def test_shutdown_waits_for_the_outcomes_in_flight_and_their_slot_releases(
    driver: CountingDriver, operations: Operations
) -> None:
    """The app's lifespan ends with ``RemoteExecutors.aclose()``: a stopping API server first
    writes the outcomes it accepted and gives their slots back (not left to run out at their
    expiry)."""
    stalled = FreezableDriver(driver)
    service = RemoteExecutors(stalled, clock=operations.clock, limit_backoff=0.2)
    app = create_app(operations=operations, tokens=TOKENS, executors=service)
    await operations.set_limit("k", names=["job"], max_running=2)
    await publisher(driver).send_many([Task("a", "job"), Task("b", "job")])
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    first, second = await lease(http, "ex-1", max_tasks=2)
    stalled.freeze("finish")
    report = asyncio.ensure_future(succeed(http, "ex-1", first))
    await wait_until(lambda: stalled.blocked == ["finish"], what="the outcome's write in flight")
    closing = asyncio.ensure_future(lifespan.__aexit__(None, None, None))
    await settle()
    assert not closing.done(), "shutdown waits for the outcome being written"
    stalled.thaw("finish")
    await asyncio.wait_for(closing, 5)
    await asyncio.wait_for(report, 5)
    assert (await operations.get_task(first["key"])).status.value == "succeeded"
    assert await holders(http) == [("ex-1", second["attempt"])]  # the finished one's slot is back
    await http.aclose()
