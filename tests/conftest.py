"""Shared fixtures: every driver (memory, Mongo on mongomock, Mongo on a real server if configured)."""

from __future__ import annotations

import logging
import os
import random
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import hypothesis.core
import pytest

from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.observability.logs import configure_logging
from mscheduler.testing.clock import FakeClock
from mscheduler.testing.mongomock import mongomock_database
from mscheduler.testing.mongos import mongos_database
from tests.layouts import PROFILE, SEED_VARIABLE

REAL_URI = os.environ.get("MSCHEDULER_TEST_MONGODB_URI")
DRIVER_KINDS = ["memory", "mongomock", "real"]


TERMINAL_SIZE = ("COLUMNS", "LINES")


def pytest_configure(config: pytest.Config) -> None:
    """One Hypothesis seed for the whole run, new each run unless given: ``--hypothesis-seed``,
    else ``MSCHEDULER_TEST_SEED``, else a random one. It is printed in the report header, and
    passed to pytest-xdist's workers (they inherit the environment), so one seed replays a run."""
    given = config.getoption("hypothesis_seed", None)
    seed = given or os.environ.get(SEED_VARIABLE) or str(random.getrandbits(32))
    os.environ[SEED_VARIABLE] = str(seed)
    hypothesis.core.global_force_seed = int(seed) if str(seed).isdigit() else seed  # type: ignore[assignment]
    # A pytest-xdist worker starts with COLUMNS and LINES set (80 x 24: readline exports them),
    # which a plain run does not have; the CLI's consoles would then print 80 columns wide
    # whatever a test asks for. The workers get the terminal size the run was started with.
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        for name in TERMINAL_SIZE:
            os.environ[f"MSCHEDULER_TEST_{name}"] = os.environ.get(name, "")
    else:
        for name in TERMINAL_SIZE:
            value = os.environ.get(f"MSCHEDULER_TEST_{name}", "")
            if value:
                os.environ[name] = value
            else:
                os.environ.pop(name, None)


# The files that take a minute or more, longest first: they run first, so that on several workers
# (``make test``: pytest-xdist hands out whole files in collection order) none of them starts
# last while the other workers have run out of work. Every other file keeps its place.
SLOW_FILES = (
    "tests/scenarios/test_model_based.py",
    "tests/soak/test_soak.py",
    "tests/soak/test_soak_everything.py",
    "tests/scenarios/test_model_based_limits.py",
    "tests/web/test_api_schemathesis.py",
    "tests/scenarios/test_planner.py",
    "tests/acceptance/test_package.py",
    "tests/scenarios/test_mixed_fleet_limits.py",
    "tests/conformance/test_conformance_lockstep.py",
    "tests/unit/test_testing_kit.py",
    "tests/unit/test_bench_compare.py",
    "tests/browser/test_dashboard.py",
    "tests/browser/test_dashboard_operator.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)

    items.sort(key=rank)  # stable: each file's tests keep their order


def pytest_report_header(config: pytest.Config) -> list[str]:
    seed = os.environ[SEED_VARIABLE]
    lines = [
        f"mscheduler: hypothesis seed {seed} (replay: --hypothesis-seed={seed}), "
        f"profile {PROFILE} (MSCHEDULER_TEST_PROFILE)"
    ]
    if REAL_URI:
        lines.append("mscheduler: real MongoDB tests ON (MSCHEDULER_TEST_MONGODB_URI is set)")
    else:
        lines.append(
            "mscheduler: real MongoDB tests SKIPPED "
            "(set MSCHEDULER_TEST_MONGODB_URI to a replica set to run them)"
        )
    return lines


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
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole test: bound here and never listened
    on. (A port bound, released and handed on could be taken meanwhile by another test, or by
    another pytest-xdist worker, and answer.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


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
    client: Any = None
    database: Any = None
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
