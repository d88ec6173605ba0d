"""Benchmark L: how long one page of the task list takes with 100,000 tasks (MemoryDriver).

``Operations.page_tasks`` (what the CLI's ``tasks ls`` calls) and ``GET /api/v1/tasks`` (the
REST API, in process through httpx's ASGI transport: routing, auth, validation and JSON
included, no socket) for the first page and for a deep page (the page after 90,000 tasks,
reached by its cursor), plus the deprecated ``skip`` to the same depth for comparison. Each
figure is the median of ``--repeat`` calls, in milliseconds.

    python -m benchmarks.list_latency [--tasks 100000] [--limit 100] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from benchmarks.common import emit, noop_tasks
from mscheduler.drivers.memory import MemoryDriver
from mscheduler.operations import Operations
from mscheduler.publisher import Publisher
from mscheduler.web.app import create_app
from mscheduler.web.auth import ApiTokens

TOKEN = "benchmark-read-token-0123456789"


async def median_ms(call: Callable[[], Awaitable[Any]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 3)


async def main(tasks: int, limit: int, repeat: int) -> None:
    driver = MemoryDriver()
    publisher = Publisher(driver)
    for start in range(0, tasks, 1000):
        await publisher.send_many(noop_tasks(min(1000, tasks - start), start))
    ops = Operations(driver)
    depth = tasks * 9 // 10
    # the cursor of the page that starts after `depth` tasks, by walking the pages once
    cursor: str | None = None
    walked = 0
    while walked < depth:
        page = await ops.page_tasks(limit=1000, cursor=cursor)
        cursor, walked = page.next_cursor, walked + len(page.tasks)
    assert cursor is not None
    deep_cursor = cursor
    first = await ops.page_tasks(limit=limit)
    deep = await ops.page_tasks(limit=limit, cursor=deep_cursor)
    assert len(first.tasks) == limit and len(deep.tasks) == limit

    app = create_app(operations=ops, tokens=ApiTokens(read=[TOKEN]), metrics=False, dashboard=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:

        async def api(params: dict[str, Any]) -> None:
            response = await client.get("/api/v1/tasks", params=params, headers=headers)
            assert response.status_code == 200, response.text

        result = {
            "benchmark": "list_latency",
            "tasks": tasks,
            "limit": limit,
            "deep_page_after": depth,
            "operations_first_page_ms": await median_ms(lambda: ops.page_tasks(limit=limit), repeat),
            "operations_deep_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, cursor=deep_cursor), repeat
            ),
            "operations_deep_page_by_skip_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, skip=depth), max(3, repeat // 4)
            ),
            "operations_status_filter_first_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, status="pending"), repeat
            ),
            "api_first_page_ms": await median_ms(lambda: api({"limit": limit}), repeat),
            "api_deep_page_ms": await median_ms(lambda: api({"limit": limit, "cursor": deep_cursor}), repeat),
        }
    emit(result)


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.limit, args.repeat))


if __name__ == "__main__":
    cli()
