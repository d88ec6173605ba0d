"""``ExecutorClient.run``: checkpoints ride the pings and reach the next attempt, a cancelled task
stops its handler (nothing reported), a run timeout fails the attempt, a remote stop ends the loop.
The API runs in process; the client's clock is the test's ``FakeClock``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, MemoryDriver, Operations, Publisher, Task, TaskOption
from mscheduler.remote.client import ExecutorClient, RemoteTask
from mscheduler.web import ApiTokens, create_app
from tests.scenarios.harness import advance_until

TOKEN = "executor-token-0123456789abcdef"
OPTION = TaskOption(ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=5))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def driver(clock: FakeClock) -> MemoryDriver:
    return MemoryDriver(clock=clock)


@pytest.fixture
def operations(driver: MemoryDriver, clock: FakeClock) -> Operations:
    return Operations(driver, clock=clock)


@pytest.fixture
async def client(operations: Operations, clock: FakeClock) -> AsyncIterator[ExecutorClient]:
    app = create_app(operations=operations, tokens=ApiTokens(executor=[TOKEN]))
    transport = httpx.ASGITransport(app=app)
    async with ExecutorClient(
        "http://t", TOKEN, "ex-1", ["job"], wait_seconds=1, transport=transport, clock=clock
    ) as executor:
        yield executor


async def test_a_checkpoint_reaches_the_next_attempt(
    client: ExecutorClient, driver: MemoryDriver, clock: FakeClock, operations: Operations
) -> None:
    await Publisher(driver, clock=clock).send(Task("t1", "job", None, option=OPTION))
    seen: list[Any] = []

    async def work(task: RemoteTask) -> Any:
        seen.append(task.checkpoint_data)
        if task.attempt_no == 1:
            await task.checkpoint({"rows": 10})
            task.progress(0.5, "half")
            raise RuntimeError("crash after the checkpoint")
        client.stop()
        return "done"

    run = asyncio.ensure_future(client.run(work))
    await advance_until(clock, run.done, step=0.25, limit=60)
    run.result()
    assert seen == [None, {"rows": 10}]
    info = await operations.get_task("t1")
    assert info.status.value == "succeeded"
    assert [w.status.value for w in info.worker_states] == ["failed", "succeeded"]


async def test_a_cancelled_task_stops_its_handler_and_reports_nothing(
    client: ExecutorClient, driver: MemoryDriver, clock: FakeClock, operations: Operations
) -> None:
    await Publisher(driver, clock=clock).send(Task("t1", "job", None, option=OPTION))
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work(task: RemoteTask) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    run = asyncio.ensure_future(client.run(work))
    await advance_until(clock, started.is_set, step=0.25, limit=10)
    await operations.cancel("t1", "not needed")
    await advance_until(clock, cancelled.is_set, step=0.25, limit=10)  # at its next ping
    assert client.stats["lost"] == 1 and client.stats["reported"] == 0
    client.stop()
    await advance_until(clock, run.done, step=0.25, limit=10)
    info = await operations.get_task("t1")
    assert info.status.value == "cancelled"


async def test_a_run_timeout_fails_the_attempt(
    client: ExecutorClient, driver: MemoryDriver, clock: FakeClock, operations: Operations
) -> None:
    option = OPTION.model_copy(update={"run_timeout": timedelta(seconds=3)})
    await Publisher(driver, clock=clock).send(Task("t1", "job", None, option=option))

    async def work(task: RemoteTask) -> Any:
        client.stop()
        await asyncio.Event().wait()

    run = asyncio.ensure_future(client.run(work))
    await advance_until(clock, run.done, step=0.25, limit=20)
    info = await operations.get_task("t1")
    entry = info.worker_states[0]
    assert entry.status.value == "failed" and entry.error is not None
    assert entry.error.type == "RunTimedOut"


async def test_a_remote_stop_ends_the_loop(
    client: ExecutorClient, clock: FakeClock, operations: Operations
) -> None:
    async def work(task: RemoteTask) -> Any:
        return None

    run = asyncio.ensure_future(client.run(work))
    await advance_until(clock, lambda: bool(client.requests), step=0.25, limit=10)
    assert await operations.request_worker_stop("ex-1")
    await advance_until(clock, run.done, step=0.25, limit=30)
    assert client.stop_requested


async def test_a_429_makes_the_client_wait_as_told_rather_than_spin(
    operations: Operations, driver: MemoryDriver, clock: FakeClock
) -> None:
    from mscheduler.web.guards import ApiLimits

    limits = ApiLimits(waits_per_token=1, waits_total=1, retry_after_seconds=5)
    app = create_app(operations=operations, tokens=ApiTokens(executor=[TOKEN]), limits=limits)
    transport = httpx.ASGITransport(app=app)
    app.state.waits.acquire("executor-1")  # another lease of this token waits already
    async with ExecutorClient(
        "http://t", TOKEN, "ex-1", ["job"], wait_seconds=1, transport=transport, clock=clock
    ) as executor:
        done: list[str] = []

        async def work(task: RemoteTask) -> Any:
            done.append(task.key)
            executor.stop()

        run = asyncio.ensure_future(executor.run(work))
        await advance_until(clock, lambda: executor.requests == 1, step=0.25, limit=4)
        for _ in range(200):  # no fake time passes: the client sleeps its 5 s, no request goes
            await asyncio.sleep(0)
        assert executor.requests == 1
        app.state.waits.release("executor-1")
        await Publisher(driver, clock=clock).send(Task("t1", "job", None, option=OPTION))
        await advance_until(clock, run.done, step=0.5, limit=40)
        assert done == ["t1"] and executor.requests >= 2
