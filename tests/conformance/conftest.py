"""The conformance suite runs every test on every driver (``make_driver`` is parametrized), and
again on stores of 4 partitions (the same rules when every claim names a partition), one of them
set up for a sharded cluster behind the mongos stand-in (``sharded-p4``: 2 shards, the tasks
collection sharded by ``MongoDriver.shard()``, every write checked as a mongos routes it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mscheduler.drivers.base import Driver
from mscheduler.testing.clock import FakeClock
from tests.conformance.support import Store
from tests.conftest import DRIVER_KINDS, DriverFactory, driver_factory


@pytest.fixture(params=[*DRIVER_KINDS, *(f"{kind}-p4" for kind in DRIVER_KINDS), "sharded-p4"])
async def make_driver(request: pytest.FixtureRequest) -> AsyncIterator[DriverFactory]:
    if request.param.endswith("-p4") and request.node.get_closest_marker("global_claim_order"):
        # the claim order (priority, aimed-at-me, due time) holds within a partition; across
        # partitions a claimer visits them round-robin from a random one (docs/scaling.md):
        # test_conformance_partitions.py shows it per partition
        pytest.skip("claims in one global order: a store of one partition")
    async for factory in driver_factory(request.param):
        yield factory


@pytest.fixture
def store(driver: Driver, fake_clock: FakeClock) -> Store:
    return Store(driver, fake_clock)
