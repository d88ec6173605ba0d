"""The conformance suite runs every test on every driver (``make_driver`` is parametrized)."""

from __future__ import annotations

import pytest

from mscheduler.drivers.base import Driver
from mscheduler.testing.clock import FakeClock
from tests.conformance.support import Store


@pytest.fixture
def store(driver: Driver, fake_clock: FakeClock) -> Store:
    return Store(driver, fake_clock)
