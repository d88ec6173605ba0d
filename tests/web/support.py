"""An app over a MemoryDriver with two tokens, an HTTP client for it, and a driver that counts
the store operations it was asked for (to show that refused input queried and wrote nothing)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
from pydantic import BaseModel

from mscheduler import FakeClock, MemoryDriver, Operations, Publisher
from mscheduler.drivers.base import WorkerInfo
from mscheduler.runtime.consumer.handlers import params_schema_text
from mscheduler.web import ApiTokens, create_app

ADMIN_TOKEN = "admin-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
TOKENS = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN])

# store operations an API request may cause (reads and writes); setup / time are not counted
COUNTED = (
    "get_task",
    "list_tasks",
    "count_by_status",
    "control_task",
    "update_option",
    "list_workers",
    "request_worker_stop",
    "insert_plan",
    "get_plan",
    "list_plans",
    "update_plan",
    "delete_plan",
)


class CountingDriver(MemoryDriver):
    """A MemoryDriver that counts the calls of the operations in ``COUNTED``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        if name in COUNTED:
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)


def client_for(operations: Operations) -> httpx.AsyncClient:
    app = create_app(operations=operations, tokens=TOKENS)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def publisher(driver: MemoryDriver) -> Publisher:
    """A publisher on the driver's clock (a ``FakeClock`` in these tests)."""
    return Publisher(driver, clock=driver.clock)


def tick(driver: MemoryDriver, ms: int = 1) -> None:
    clock = driver.clock
    assert isinstance(clock, FakeClock)
    clock.advance(ms / 1000)


async def live_worker(
    driver: MemoryDriver,
    *names: str,
    worker_id: str = "w-live",
    models: dict[str, type[BaseModel]] | None = None,
) -> None:
    """Register a live worker handling ``names`` now (on the driver's clock), publishing the
    params schema of each handler in ``models`` as a consumer does: sends over the API are
    checked against it."""
    published = {name: params_schema_text(model) for name, model in (models or {}).items()}
    schemas = [(name, text) for name, text in published.items() if text is not None]
    info = WorkerInfo(
        worker_id, "h", 1, sorted(set(names) | set(models or ())), 1, driver.clock.now(), schemas=schemas
    )
    await driver.register_worker(info)
