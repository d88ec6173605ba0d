"""A mixed fleet under one flow limit: Python consumers and HTTP executors (through two API
servers behind a round-robin "load balancer", so an executor's lease, pings and reports land on
different servers) share ``max_running=3`` over 240 tasks, and a rate limit over a smaller run.

The store is the witness: after every step of fake time the limit's live slots are at most 3; at
the end, from the task entries' own lease intervals, no instant had more than 3 live leases, every
task succeeded (the one whose executor died mid-task after its lease was lost), and no slot is left
held. The rate run checks that no window of the rate's period holds more starts than it allows.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import httpx

from mscheduler import Consumer, FakeClock, Operations, Publisher, Task, TaskContext
from mscheduler.domain.listing import ListParams
from mscheduler.remote.client import ExecutorClient, RemoteTask
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import create_app
from tests.scenarios.harness import advance_until, running_entries
from tests.scenarios.test_mixed_fleet import OPTION as FLEET_OPTION
from tests.scenarios.test_mixed_fleet import STEP, TOKEN, TOKENS, DeadConnection

OPTION = FLEET_OPTION.model_copy(update={"worker_timeout": timedelta(seconds=3)})
MAX_RUNNING = 3


class RoundRobin(httpx.AsyncBaseTransport):
    """A load balancer: each request goes to the next API server — in turn per kind of request
    (lease, ping, report), so that every server sees every kind once two of a kind were sent.
    (One turn over all requests left it to the interleaving of two executors which server got
    the pings: once in CI, one server got none.)"""

    def __init__(self, servers: list[httpx.AsyncBaseTransport]) -> None:
        self.servers = servers
        self.sent: dict[str, int] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        kind = request.url.path.rsplit("/", 1)[-1]
        turn = self.sent[kind] = self.sent.get(kind, -1) + 1
        return await self.servers[turn % len(self.servers)].handle_async_request(request)


def lease_intervals(docs: list[dict[str, Any]]) -> list[tuple[datetime, datetime]]:
    """Each attempt's lease as the store recorded it: from its start to its end (its outcome
    written) or its lease's expiry, whichever came first."""
    out = []
    for doc in docs:
        for entry in doc["state"]["worker_states"]:
            end = entry["ping_expire_time"]
            if entry.get("end_time") is not None:
                end = min(end, entry["end_time"])
            out.append((entry["start_time"], end))
    return out


def peak_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals ``[start, end)`` holding one instant."""
    edges = sorted(
        [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1])
    )
    peak = live = 0
    for _, step in edges:  # at one instant ends (-1) count before starts (+1)
        live += step
        peak = max(peak, live)
    return peak


class Fleet:
    """Two consumers and three executors (one of them doomed) over one store and two API servers."""

    def __init__(self, make_driver: Any, clock: FakeClock, hang_key: str | None) -> None:
        self.make_driver = make_driver
        self.clock = clock
        self.hang_key = hang_key
        self.hanging = asyncio.Event()
        self.consumers: list[Consumer] = []
        self.clients: dict[str, ExecutorClient] = {}
        self.runs: dict[str, asyncio.Future[None]] = {}
        self.ran_by: dict[str, str] = {}
        self.services: list[RemoteExecutors] = []
        self.balancer = self._balancer()  # every executor's requests, to either server in turn
        self.dead = DeadConnection(self.balancer)

    def _balancer(self) -> RoundRobin:
        servers: list[httpx.AsyncBaseTransport] = []
        for _ in range(2):
            service = RemoteExecutors(self.make_driver(self.clock), clock=self.clock, poll_interval=0.5)
            self.services.append(service)
            operations = Operations(self.make_driver(self.clock), clock=self.clock)
            servers.append(
                httpx.ASGITransport(app=create_app(operations=operations, tokens=TOKENS, executors=service))
            )
        return RoundRobin(servers)

    async def work(self, key: str, params: Any, worker_id: str) -> Any:
        if key == self.hang_key and worker_id == "ex-dead":
            self.hanging.set()
            await asyncio.Event().wait()  # its host dies meanwhile
        await self.clock.sleep(params["seconds"])
        self.ran_by[key] = worker_id
        return {"by": worker_id}

    def start_consumers(self, concurrency: int = 3) -> None:
        for worker_id in ("py-1", "py-2"):
            consumer = Consumer(
                self.make_driver(self.clock),
                worker_id=worker_id,
                clock=self.clock,
                poll_interval=0.5,
                concurrency=concurrency,
            )

            async def handle(params: Any, ctx: TaskContext) -> Any:
                return await self.work(ctx.key, params, ctx.worker_id)

            consumer.register("job", handle)
            self.consumers.append(consumer)

    def start_executor(
        self, worker_id: str, transport: httpx.AsyncBaseTransport, concurrency: int = 2
    ) -> None:
        client = ExecutorClient(
            "http://test",
            TOKEN,
            worker_id,
            ["job"],
            concurrency=concurrency,
            wait_seconds=2,
            transport=transport,
            clock=self.clock,
        )
        self.clients[worker_id] = client

        async def handle(task: RemoteTask) -> Any:
            return await self.work(task.key, task.params, worker_id)

        self.runs[worker_id] = asyncio.ensure_future(client.run(handle))

    async def stop(self) -> None:
        for worker_id, client in self.clients.items():
            if worker_id != "ex-dead":
                client.stop()
        for consumer in self.consumers:
            await consumer.stop()
        await advance_until(
            self.clock,
            lambda: all(run.done() for w, run in self.runs.items() if w != "ex-dead"),
            step=STEP,
            limit=30,
        )
        for service in self.services:
            await service.aclose()
        for client in self.clients.values():
            await client.aclose()
        for worker_id, run in self.runs.items():
            if worker_id != "ex-dead":
                run.result()  # an executor that died of an error fails the test here


async def test_max_running_holds_across_consumers_and_executors_on_two_api_servers(
    make_driver: Any, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    await store.setup()
    operations = Operations(store, clock=fake_clock)
    await operations.set_limit("cap", names=["job"], max_running=MAX_RUNNING)
    durations = (0.0, 0.25, 0.5, 0.75)
    tasks = [Task(f"t{n:03}", "job", {"seconds": durations[n % 4]}, option=OPTION) for n in range(240)]
    await Publisher(store, clock=fake_clock).send_many(tasks)
    fleet = Fleet(make_driver, fake_clock, hang_key="t000")

    # the doomed executor starts first, alone, so that it takes t000 (and its slot) and dies
    fleet.start_executor("ex-dead", fleet.dead)
    await advance_until(fake_clock, fleet.hanging.is_set, step=STEP, limit=30)
    [doomed] = running_entries(await store.get_task("t000"))
    assert doomed["worker_id"] == "ex-dead"
    holders = {(w, a) for w, a, _ in (await operations.get_limit("cap")).holders}
    assert ("ex-dead", doomed["attempt"]) in holders
    fleet.dead.dead = True  # no ping, no report from here on
    fleet.runs["ex-dead"].cancel()

    # each kind can hold at most two of the three slots (two consumers and two executors of one
    # slot each), so neither can shut the other out: both kinds do work, whoever asks first
    fleet.start_consumers(concurrency=1)
    for consumer in fleet.consumers:
        await consumer.start()
    for worker_id in ("ex-1", "ex-2"):
        fleet.start_executor(worker_id, fleet.balancer, concurrency=1)

    async def slots_within_the_limit() -> bool:
        info = await operations.get_limit("cap")
        assert info.running <= MAX_RUNNING, info.holders
        docs = await store.list_tasks(ListParams(name="job", limit=1000))
        return all(doc["state"]["status"] == "succeeded" for doc in docs)

    await advance_until(fake_clock, slots_within_the_limit, step=STEP, limit=600)
    await fleet.stop()

    docs = await store.list_tasks(ListParams(name="job", limit=1000))
    assert len(docs) == 240 and all(doc["state"]["status"] == "succeeded" for doc in docs)
    assert peak_overlap(lease_intervals(docs)) == MAX_RUNNING  # never above, and reached
    [t000] = [doc for doc in docs if doc["key"] == "t000"]
    assert [e["status"] for e in t000["state"]["worker_states"]][:1] == ["lost"]
    by = set(fleet.ran_by.values())
    assert by & {"py-1", "py-2"} and by & {"ex-1", "ex-2"}, by  # both kinds did the work
    info = await operations.get_limit("cap")
    assert info.running == 0 and info.holders == ()  # every slot released, none left held
    # the executors' pings and reports did reach the server that had not leased the attempt
    assert all(service.stats["pings"] and service.stats["reports"] for service in fleet.services)


async def test_a_rate_limit_holds_across_consumers_and_executors(
    make_driver: Any, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    await store.setup()
    operations = Operations(store, clock=fake_clock)
    await operations.set_limit("rated", names=["job"], rate="4/2s")
    tasks = [Task(f"r{n:02}", "job", {"seconds": 0.25}, option=OPTION) for n in range(40)]
    await Publisher(store, clock=fake_clock).send_many(tasks)
    fleet = Fleet(make_driver, fake_clock, hang_key=None)
    fleet.start_consumers()
    for consumer in fleet.consumers:
        await consumer.start()
    # the consumers first (whoever asks first when the window frees a start wins it, and the
    # executors' waiting leases happen to ask first on this fake clock): both kinds then start tasks
    await advance_until(fake_clock, lambda: len(fleet.ran_by) >= 4, step=STEP, limit=30)
    for worker_id in ("ex-1", "ex-2"):
        fleet.start_executor(worker_id, fleet.balancer)

    async def all_succeeded() -> bool:
        docs = await store.list_tasks(ListParams(name="job", limit=1000))
        return all(doc["state"]["status"] == "succeeded" for doc in docs)

    await advance_until(fake_clock, all_succeeded, step=STEP, limit=120)
    await fleet.stop()

    docs = await store.list_tasks(ListParams(name="job", limit=1000))
    starts = sorted(e["start_time"] for doc in docs for e in doc["state"]["worker_states"])
    assert len(starts) == 40
    window = timedelta(seconds=2)
    assert all(starts[i + 4] - starts[i] >= window for i in range(len(starts) - 4))
    by = set(fleet.ran_by.values())
    assert by & {"py-1", "py-2"} and by & {"ex-1", "ex-2"}, by
