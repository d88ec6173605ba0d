"""Benchmark L: how long one page of the task list takes with 100,000 tasks (MemoryDriver).

``Operations.page_tasks`` (what the CLI's ``tasks ls`` calls) and ``GET /api/v1/tasks`` (the
REST API, in process through httpx's ASGI transport: routing, auth, validation and JSON
included, no socket) for the first page and for a deep page (the page after 90,000 tasks,
reached by its cursor), plus the deprecated ``skip`` to the same depth for comparison; then the
same first / deep page for a finished range (half of the tasks finished, at scattered times: a
listing in finish-time order) and for a group (every tenth task is aimed at one group: a
listing of 10 % of the store in creation order). Each figure is the median of ``--repeat``
calls, in milliseconds.

    python -m benchmarks.list_latency [--tasks 100000] [--limit 100] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx

from benchmarks.common import TASK_NAME, emit
from mscheduler.domain.model import Task, TaskOption
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.operations import Operations
from mscheduler.runtime.publisher import Publisher
from mscheduler.web.app import create_app
from mscheduler.web.auth import ApiTokens

TOKEN = "benchmark-read-token-0123456789"
GROUP = "gpu"
AIMED, PLAIN = TaskOption(specific_groups=(GROUP,)), TaskOption()


def bench_tasks(count: int, start: int) -> list[Task]:
    """No-op tasks; every tenth aimed at ``GROUP``."""
    return [
        Task(f"task-{i}", TASK_NAME, option=AIMED if i % 10 == 0 else PLAIN)
        for i in range(start, start + count)
    ]


async def finish_half(driver: MemoryDriver, tasks: int) -> datetime:
    """Claim and finish half of the tasks, each at a scattered time within its batch's lease
    (so finish order is not creation order); returns a time before every finish."""
    rng = random.Random(7)
    start = driver.clock.now()
    for batch in range(tasks // 2 // 1000):
        now = start + timedelta(seconds=batch)
        attempts = [f"a-{batch}-{i}" for i in range(1000)]
        claimed = await driver.claim(ClaimParams("bench", [TASK_NAME], now, attempts, groups=[GROUP]))
        done = [
            FinishParams(
                c.key, "bench", c.attempt, now + timedelta(milliseconds=rng.randrange(25_000)), "succeeded"
            )
            for c in claimed
        ]
        assert all(await driver.finish(done))
    return start


async def deep_cursor(ops: Operations, depth: int, **filters: Any) -> str:
    """The cursor of the page that starts after ``depth`` tasks, by walking the pages once."""
    cursor: str | None = None
    walked = 0
    while walked < depth:
        page = await ops.page_tasks(limit=1000, cursor=cursor, **filters)
        cursor, walked = page.next_cursor, walked + len(page.tasks)
    assert cursor is not None
    return cursor


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
        await publisher.send_many(bench_tasks(min(1000, tasks - start), start))
    since = await finish_half(driver, tasks)
    ops = Operations(driver)
    depth = tasks * 9 // 10
    deep = await deep_cursor(ops, depth)
    finished = {"finished_from": since}
    finished_depth = tasks // 2 * 9 // 10
    deep_finished = await deep_cursor(ops, finished_depth, **finished)
    group_depth = tasks // 10 * 9 // 10
    deep_group = await deep_cursor(ops, group_depth, group=GROUP)
    for filters, cursor in (({}, deep), (finished, deep_finished), ({"group": GROUP}, deep_group)):
        first_page = await ops.page_tasks(limit=limit, **filters)
        deep_page = await ops.page_tasks(limit=limit, cursor=cursor, **filters)
        assert len(first_page.tasks) == limit and len(deep_page.tasks) == limit

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
                lambda: ops.page_tasks(limit=limit, cursor=deep), repeat
            ),
            "operations_deep_page_by_skip_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, skip=depth), max(3, repeat // 4)
            ),
            "operations_status_filter_first_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, status="pending"), repeat
            ),
            "api_first_page_ms": await median_ms(lambda: api({"limit": limit}), repeat),
            "api_deep_page_ms": await median_ms(lambda: api({"limit": limit, "cursor": deep}), repeat),
            "finished_tasks": tasks // 2,
            "finished_deep_page_after": finished_depth,
            "operations_finished_first_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, **finished), repeat
            ),
            "operations_finished_deep_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, cursor=deep_finished, **finished), repeat
            ),
            "group_tasks": tasks // 10,
            "group_deep_page_after": group_depth,
            "operations_group_first_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, group=GROUP), repeat
            ),
            "operations_group_deep_page_ms": await median_ms(
                lambda: ops.page_tasks(limit=limit, cursor=deep_group, group=GROUP), repeat
            ),
            "api_finished_deep_page_ms": await median_ms(
                lambda: api({"limit": limit, "cursor": deep_finished, "finished_from": since.isoformat()}),
                repeat,
            ),
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
