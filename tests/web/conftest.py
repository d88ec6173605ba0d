from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from mscheduler import FakeClock, Operations
from tests.web.support import CountingDriver, client_for


@pytest.fixture
def driver() -> CountingDriver:
    return CountingDriver(clock=FakeClock())  # creation times move only when a test says so


@pytest.fixture
def operations(driver: CountingDriver) -> Operations:
    return Operations(driver, clock=driver.clock)


@pytest.fixture
async def client(operations: Operations) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(operations) as http:
        yield http
