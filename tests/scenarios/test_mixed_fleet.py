"""A mixed fleet on one store: Python consumers and remote executors over HTTP (the REST API in
process, through httpx's ASGI transport) share the same tasks and keep every reliability promise.

The work: plain tasks, fan-out tasks (``concurrent_worker_cnt=2``), tasks whose first attempts
fail (retried by policy), tasks that snooze once, and one task whose executor dies mid-run (its
HTTP connection goes dead: no ping, no report). After every step of fake time the harness checks
that no task has more live leases than its ``concurrent_worker_cnt`` and that no handler run of a
slot overlaps another; at the end that every task ended (none lost), each succeeded task holds
exactly ``concurrent_worker_cnt`` successes by distinct workers, and that the dead executor's late
report is refused (fencing), leaving the task as its new owner wrote it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import Consumer, FakeClock, Operations, Publisher, Task, TaskContext, TaskOption
from mscheduler.domain.exceptions import LeaseLost, Snooze
from mscheduler.remote.client import ExecutorClient, RemoteTask
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import ApiTokens, create_app
from tests.scenarios.harness import Overlap, advance_until, running_entries

TOKEN = "executor-token-0123456789abcdef"
TOKENS = ApiTokens(executor=[TOKEN])
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=5),
    retry_delay=timedelta(seconds=1),
    max_unexpected_retries=5,
)
STEP = 0.25


class DeadConnection(httpx.AsyncBaseTransport):
    """An executor's connection that can die (as its host would): every request fails after."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.dead = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.dead:
            raise httpx.ConnectError("the executor's host is gone")
        return await self.inner.handle_async_request(request)


def tasks() -> list[Task]:
    out = [Task(f"plain-{n}", "job", {"n": n}, option=OPTION) for n in range(24)]
    fan = OPTION.model_copy(update={"concurrent_worker_cnt": 2})
    out += [Task(f"fan-{n}", "job", {"n": n}, option=fan) for n in range(6)]
    out += [Task(f"flaky-{n}", "job", {"fail": 2}, option=OPTION) for n in range(6)]
    out += [Task(f"snooze-{n}", "job", {"snooze": True}, option=OPTION) for n in range(4)]
    out.append(Task("doomed", "job", {"hang_on": "ex-dead"}, option=OPTION))
    return out


async def test_consumers_and_http_executors_keep_the_promises_together(
    make_driver, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    await store.setup()
    publisher = Publisher(store, clock=fake_clock)
    operations = Operations(store, clock=fake_clock)
    app = create_app(
        operations=Operations(make_driver(fake_clock), clock=fake_clock),
        tokens=TOKENS,
        executors=RemoteExecutors(make_driver(fake_clock), clock=fake_clock, poll_interval=0.5),
    )
    asgi = httpx.ASGITransport(app=app)
    overlap = Overlap()
    ran_by: dict[str, list[str]] = {}
    attempts_seen: dict[str, int] = {}
    hanging = asyncio.Event()

    async def work(key: str, params: Any, worker_id: str) -> Any:
        overlap.enter(key, worker_id)
        try:
            await asyncio.sleep(0)
            attempts_seen[key] = attempts_seen.get(key, 0) + 1
            if params.get("hang_on") == worker_id:
                hanging.set()
                await asyncio.Event().wait()  # its host dies meanwhile
            if attempts_seen[key] <= params.get("fail", 0):
                raise RuntimeError(f"{key}: attempt {attempts_seen[key]} fails")
            if params.get("snooze") and attempts_seen[key] == 1:
                raise Snooze(2)
            ran_by.setdefault(key, []).append(worker_id)
            return {"by": worker_id}
        finally:
            overlap.leave(key, worker_id)

    consumers = []
    for worker_id in ("py-1", "py-2"):
        consumer = Consumer(
            make_driver(fake_clock), worker_id=worker_id, clock=fake_clock, poll_interval=1.0, concurrency=2
        )

        async def handle(params: Any, ctx: TaskContext) -> Any:
            return await work(ctx.key, params, ctx.worker_id)

        consumer.register("job", handle)
        consumers.append(consumer)

    clients: dict[str, ExecutorClient] = {}
    transports: dict[str, DeadConnection] = {}
    for worker_id in ("ex-dead", "ex-1", "ex-2"):
        transports[worker_id] = DeadConnection(asgi)
        clients[worker_id] = ExecutorClient(
            "http://test",
            TOKEN,
            worker_id,
            ["job"],
            concurrency=2,
            wait_seconds=2,
            transport=transports[worker_id],
            clock=fake_clock,
        )

    def runner(client: ExecutorClient) -> Any:
        async def handle(task: RemoteTask) -> Any:
            return await work(task.key, task.params, client.worker_id)

        return handle

    await publisher.send_many(tasks())
    # the dead executor starts first, alone, so that it takes the doomed task
    runs = {"ex-dead": asyncio.ensure_future(clients["ex-dead"].run(runner(clients["ex-dead"])))}
    await advance_until(fake_clock, hanging.is_set, step=STEP, limit=30)
    doomed = await store.get_task("doomed")
    [dead_entry] = running_entries(doomed)
    assert dead_entry["worker_id"] == "ex-dead"
    transports["ex-dead"].dead = True  # no ping, no report from here on
    runs["ex-dead"].cancel()

    for worker_id in ("ex-1", "ex-2"):
        runs[worker_id] = asyncio.ensure_future(clients[worker_id].run(runner(clients[worker_id])))
    for consumer in consumers:
        await consumer.start()

    by_key = {t.key: t for t in tasks()}

    def promises_hold() -> None:
        for key, peak in overlap.peak.items():
            assert peak <= by_key[key].option.concurrent_worker_cnt, f"{key}: {peak} runs at once"
        assert not overlap.same_worker_twice

    async def leases_hold() -> None:
        now = fake_clock.now()
        for key, task in by_key.items():
            doc = await store.get_task(key)
            live = [e for e in running_entries(doc) if e["ping_expire_time"] > now]
            assert len(live) <= task.option.concurrent_worker_cnt, f"{key}: {len(live)} live leases"

    async def all_ended() -> bool:
        await leases_hold()
        infos = await operations.get_tasks(list(by_key))
        return all(info.status.value in ("succeeded", "failed") for info in infos.values())

    await advance_until(fake_clock, all_ended, step=STEP, limit=240, check=promises_hold)

    # No task lost; each succeeded once per slot, by distinct workers; failures only by budget.
    infos = await operations.get_tasks(list(by_key))
    for key, info in infos.items():
        assert info.status.value == "succeeded", (key, info.status)
        cnt = by_key[key].option.concurrent_worker_cnt
        winners = [w.worker_id for w in info.worker_states if w.status.value == "succeeded"]
        assert len(winners) == cnt and len(set(winners)) == cnt, (key, winners)
        assert len(ran_by[key]) == cnt, (key, ran_by[key])
    doomed_info = infos["doomed"]
    assert [w.status.value for w in doomed_info.worker_states][:1] == ["lost"]
    assert doomed_info.worker_states[0].worker_id == "ex-dead"

    # Both kinds of workers did the work.
    workers = {w for key in by_key for w in ran_by[key]}
    assert {"py-1", "py-2"} & workers and {"ex-1", "ex-2"} & workers, workers

    # Fencing: the dead executor's report, arriving late, is refused and changes nothing.
    async with ExecutorClient(
        "http://test", TOKEN, "ex-dead", ["job"], transport=asgi, clock=fake_clock
    ) as late:
        with pytest.raises(LeaseLost):
            await late.report("doomed", dead_entry["attempt"], "succeeded", result="late")
    assert (await publisher.get("doomed")).worker_states == doomed_info.worker_states

    for worker_id in ("ex-1", "ex-2"):
        clients[worker_id].stop()
    for consumer in consumers:
        await consumer.stop()
    await advance_until(fake_clock, lambda: runs["ex-1"].done() and runs["ex-2"].done(), step=STEP, limit=30)
    for client in clients.values():
        await client.aclose()
    for run in runs.values():
        if not run.cancelled():
            run.result()  # an executor that died of an error fails the test here
