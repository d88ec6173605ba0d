"""``App``: handlers, consumers and plans defined apart from the store; one definition builds
consumers on any store (memory, Mongo on mongomock) that run its handlers; bad definitions are
refused when made, naming what is wrong."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime
from typing import Any

import pytest

from mscheduler import (
    App,
    EverySchedule,
    InvalidInput,
    MemoryDriver,
    MongoDriver,
    Operations,
    Plan,
    PlanTiming,
    Publisher,
    Task,
    TaskContext,
)
from mscheduler.testing import mongomock_database


def make_app() -> App:
    app = App("shop")

    @app.handler("double")
    async def double(params: dict[str, int], ctx: TaskContext) -> int:
        return params["n"] * 2

    @app.handler("shout")
    def shout(params: dict[str, str]) -> str:  # a plain function: a thread
        return params["text"].upper()

    return app


@pytest.mark.parametrize("store", ["memory", "mongomock"])
async def test_one_app_runs_on_any_store(store: str) -> None:
    app = make_app()
    driver = MemoryDriver() if store == "memory" else MongoDriver(mongomock_database(), create_indexes=True)
    consumers = app.consumers(driver, poll_interval=0.02)
    assert [sorted(c._handlers) for c in consumers] == [["double", "shout"]]
    publisher = Publisher(driver)
    for consumer in consumers:
        await consumer.start()
    try:
        await publisher.send_many([Task("d", "double", {"n": 21}), Task("s", "shout", {"text": "hi"})])
        assert await publisher.wait("d", timeout=10) == 42
        assert await publisher.wait("s", timeout=10) == "HI"
    finally:
        await asyncio.gather(*(c.stop() for c in consumers))


def test_declared_consumers_split_names_and_settings() -> None:
    app = make_app()
    app.consumer(names=["double"], concurrency=20, worker_id="doubler")
    app.consumer(names=["shout"], thread_pool_size=2)
    first, second = app.consumers(MemoryDriver())
    assert (first.worker_id, first.concurrency, sorted(first._handlers)) == ("doubler", 20, ["double"])
    assert sorted(second._handlers) == ["shout"] and second.pools.thread_count == 2
    assert first.driver is second.driver


@pytest.mark.parametrize(
    ("define", "says"),
    [
        (lambda app: app.register("bad name!", lambda p: p), "name"),
        (
            lambda app: app.register("x", 42),
            "handler for 'x': 42 is neither an async function nor a callable",
        ),
        (lambda app: app.register("double", lambda p: p), "already registered in 'shop'"),
        (lambda app: app.consumer(concurrency=0), "concurrency must be at least 1"),
        (lambda app: app.consumer(poll_every=3), "unexpected keyword argument 'poll_every'"),
        (lambda app: app.consumer(driver=MemoryDriver()), "driver is given when the consumers are built"),
        (lambda app: app.consumer(names="double"), "names is a non-empty list"),
        (lambda app: app.plan("nightly"), "app.plan() takes a Plan"),
    ],
)
def test_a_bad_definition_is_refused_when_made(define: Any, says: str) -> None:
    app = make_app()
    with pytest.raises(InvalidInput) as refused:
        define(app)
    assert says in str(refused.value)


def test_an_app_without_handlers_or_with_an_unknown_name_builds_nothing() -> None:
    with pytest.raises(InvalidInput, match="app 'empty' defines no handler, so no consumer"):
        App("empty").consumers(MemoryDriver())
    app = make_app()
    app.consumer(names=["double", "missing"])
    with pytest.raises(InvalidInput, match=r"runs \['missing'\], which has no handler"):
        app.consumers(MemoryDriver())


async def test_plans_are_created_once_and_left_alone_after() -> None:
    app = make_app()
    timing = PlanTiming(schedule=EverySchedule(interval=60, start=datetime(2030, 1, 1, tzinfo=UTC)))
    app.plan(Plan(plan_id="every-minute", name="double", params={"n": 1}, timing=timing))
    ops = Operations(MemoryDriver())
    assert await app.add_plans(ops) == ["every-minute"]
    await ops.suspend_plan("every-minute")  # an operator's change survives a restart
    assert await app.add_plans(ops) == []
    assert (await ops.get_plan("every-minute")).suspended


def test_a_partial_and_a_process_handler_are_kept_as_given() -> None:
    app = App()
    app.register("p", functools.partial(pow, 2), run_in="thread")
    [consumer] = app.consumers(MemoryDriver())
    assert consumer._handlers["p"].run_in == "thread"
