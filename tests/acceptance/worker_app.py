"""Consumers for the ``mscheduler worker`` acceptance tests (imported by the CLI in a subprocess).

``factory`` builds two consumers on a MemoryDriver and publishes their work itself (a memory store
lives in one process). Environment: ``ACC_QUICK`` quick tasks (default 5), ``ACC_SLOW_SECONDS``
adds one task that sleeps that long (default none), ``ACC_GRACE`` each consumer's grace period.
Handlers print what they do, so the test can follow along.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from mscheduler import Consumer, MemoryDriver, Publisher, Task, TaskContext


class Item(BaseModel):
    n: int = 0
    seconds: float = 0.0


def say(line: str) -> None:
    print(line, flush=True)


async def factory() -> list[Consumer]:
    driver = MemoryDriver()
    grace = float(os.environ.get("ACC_GRACE", "30"))
    consumers = [
        Consumer(driver, worker_id=f"acc-worker-{i}", poll_interval=0.1, grace_period=grace) for i in (1, 2)
    ]
    for consumer in consumers:

        @consumer.handler("acc.quick")
        async def quick(params: Item, ctx: TaskContext) -> int:
            say(f"processed {ctx.key} on {ctx.worker_id}")
            return params.n * 2

        @consumer.handler("acc.slow")
        async def slow(params: Item, ctx: TaskContext) -> str:
            say(f"slow started {ctx.key} on {ctx.worker_id}")
            try:
                await asyncio.sleep(params.seconds)
            except asyncio.CancelledError:
                say(f"slow cancelled {ctx.key}")
                raise
            say(f"slow finished {ctx.key}")
            return "done"

    tasks = [Task(f"quick-{i}", "acc.quick", Item(n=i)) for i in range(int(os.environ.get("ACC_QUICK", "5")))]
    slow_seconds = float(os.environ.get("ACC_SLOW_SECONDS", "0"))
    if slow_seconds:
        tasks.append(Task("slow-0", "acc.slow", Item(seconds=slow_seconds)))
    await Publisher(driver).send_many(tasks)
    return consumers


def sync_factory() -> Consumer:
    """A plain (non-async) factory returning one consumer."""
    consumer = Consumer(MemoryDriver(), worker_id="acc-sync")

    @consumer.handler("acc.noop")
    async def noop() -> None:
        return None

    return consumer


def broken_factory() -> Consumer:
    raise RuntimeError("the factory could not connect to its database")


def factory_with_argument(driver: MemoryDriver) -> Consumer:
    return Consumer(driver)


not_a_consumer = 42


def mongo_factory() -> Consumer:
    """A consumer on the MongoDB server at ``ACC_MONGODB_URI`` (the client is built as users do)."""
    from pymongo import AsyncMongoClient

    from mscheduler import MongoDriver

    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(os.environ["ACC_MONGODB_URI"])
    consumer = Consumer(MongoDriver(client["acc"]), worker_id="acc-mongo")

    @consumer.handler("acc.noop")
    async def noop() -> None:
        return None

    return consumer
