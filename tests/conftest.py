"""Shared fixtures: every driver (memory, Mongo on mongomock, Mongo on a real server if configured)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.observability.logs import configure_logging
from mscheduler.testing.clock import FakeClock
from mscheduler.testing.mongomock import mongomock_database
from mscheduler.testing.mongos import mongos_database

REAL_URI = os.environ.get("MSCHEDULER_TEST_MONGODB_URI")
DRIVER_KINDS = ["memory", "mongomock", "real"]


def pytest_report_header(config: pytest.Config) -> str:
    if REAL_URI:
        return "mscheduler: real MongoDB tests ON (MSCHEDULER_TEST_MONGODB_URI is set)"
    return (
        "mscheduler: real MongoDB tests SKIPPED "
        "(set MSCHEDULER_TEST_MONGODB_URI to a replica set to run them)"
    )


@pytest.fixture(autouse=True)
def _root_logging_as_it_was() -> Iterator[None]:
    """A CLI command run in-process (``web``, ``worker``, ``dev``, ``retention``) configures the
    root logger for a process of its own (``configure_logging``: INFO to stderr): undone after
    the test, so that later tests do not see their libraries' INFO lines on stderr (the CLI-over-
    API tests after the web tests did)."""
    root = logging.getLogger()
    level = root.level
    yield
    ours = [h for h in root.handlers if type(h).__module__ == configure_logging.__module__]
    for handler in ours:  # (pytest's own capture handlers come and go with each phase)
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


DriverFactory = Callable[[FakeClock | None], Driver]


@pytest.fixture(params=DRIVER_KINDS)
async def make_driver(request: pytest.FixtureRequest) -> AsyncIterator[DriverFactory]:
    """A factory of drivers of one kind; all drivers made in one test share one store."""
    async for factory in driver_factory(request.param):
        yield factory


async def driver_factory(kind: str) -> AsyncIterator[DriverFactory]:
    """``make_driver``'s factory for ``kind``: ``memory``, ``mongomock``, ``real`` or ``sharded``
    (the Mongo driver on a store set up for a sharded cluster, behind the mongos stand-in of
    ``mscheduler.testing.mongos``; the ``driver`` fixture shards it), optionally with ``-p<N>``:
    a store of N partitions (the conformance suite runs with 4)."""
    kind, _, parts = kind.partition("-p")
    partitions = int(parts) if parts else 1
    if kind == "real" and not REAL_URI:
        pytest.skip("MSCHEDULER_TEST_MONGODB_URI is not set")
    memory: MemoryDriver | None = None
    client = None
    database = None
    if kind == "mongomock":
        database = mongomock_database()
    elif kind == "sharded":
        database = mongos_database()
    elif kind == "real":
        from pymongo import AsyncMongoClient

        client = AsyncMongoClient(REAL_URI)
        database = client[f"mscheduler_test_{uuid.uuid4().hex[:8]}"]

    def factory(clock: FakeClock | None = None) -> Driver:
        nonlocal memory
        if kind == "memory":
            if memory is None:
                memory = MemoryDriver(clock=clock, partitions=partitions)
            return memory
        # a throwaway store builds its indexes at the driver's first start (a real one is set up)
        throwaway = kind != "real"
        return MongoDriver(
            database, partitions=partitions, sharded=kind == "sharded", create_indexes=throwaway
        )

    yield factory
    if client is not None:
        await client.drop_database(database.name)
        await client.close()


@pytest.fixture
async def driver(make_driver: DriverFactory, fake_clock: FakeClock) -> Driver:
    d = make_driver(fake_clock)
    await d.setup()
    if isinstance(d, MongoDriver) and d.sharded:
        await d.shard()  # as `mscheduler setup --shards` does, on the stand-in's mongos
    return d
