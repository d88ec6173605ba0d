"""Fixtures for consumer-level tests: a harness over every driver kind, on a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mscheduler import FakeClock
from tests.consumer.support import Harness


@pytest.fixture
async def harness(make_driver, fake_clock: FakeClock) -> AsyncIterator[Harness]:
    h = Harness(make_driver, fake_clock)
    yield h
    await h.close()
