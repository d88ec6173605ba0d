"""A store for the dashboard to show: tasks of every status (with attempts, errors and
tracebacks, a checkpoint and progress, a family of child tasks, events), plans and workers.

``seed(driver)`` fills a ``MemoryDriver(events=True)`` and returns a ``Consumer`` left running
(a live worker with one long task in progress); the caller stops it. Everything runs on the real
clock in the server's event loop, so the pages show what a real store would.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mscheduler import Child, Consumer, MemoryDriver, Operations, Publisher, Task, TaskOption
from mscheduler.domain.model import TaskStatus
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import CronSchedule, EverySchedule, PlanTiming
from mscheduler.drivers.base import InsertParams, NewTask, WorkerInfo
from mscheduler.runtime.consumer import TaskContext

XSS_KEY = "<img src=x onerror=alert(1)>"
DOTS_KEY = "reports/../invoice-1001"  # a browser would resolve the ".." in a URL path
LIVE_WORKER = "worker-live-1"
IDLE_WORKER = "worker-idle-2"
CANCEL_ME = "invoice-1003"  # pending: the admin test cancels it
FAILED_KEY = "resize-bad-7"
LONG_KEY = "import-2026-11"
WORKFLOW_KEY = "book-2026-11"  # a workflow: a list, a map over it, a join, a step beside


@dataclass
class Seeded:
    consumer: Consumer
    long_started: asyncio.Event


class InvoiceDeclined(Exception):
    pass


async def _wait_for(ops: Operations, key: str, statuses: set[TaskStatus], timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await ops.get_task(key)).status not in statuses:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{key} did not reach {statuses}")
        await asyncio.sleep(0.02)


async def seed(driver: MemoryDriver) -> Seeded:
    ops = Operations(driver)
    sender = Publisher(driver)
    now = datetime.now(UTC)
    quick = TaskOption(retry_delay=timedelta(milliseconds=50), max_unexpected_retries=1)

    # pending: names no consumer here handles, one paused, one the admin test cancels
    await sender.send_many(
        [
            Task(
                f"invoice-{n}",
                "send_invoice",
                {"customer": n, "amount": 10 * n},
                option=TaskOption(fair_key="acme"),
            )
            for n in (1001, 1002)
        ]
        + [
            Task(CANCEL_ME, "send_invoice", {"customer": 1003, "amount": 99}),
            Task("report-weekly", "report", {"week": 47}, option=TaskOption(priority=5)),
            Task(XSS_KEY, "report", {"note": "<script>alert('params')</script>"}),
        ]
    )
    # a key with '/' is a child's and is never sent: written below the rules (a store of another
    # build, a child of a parent named "reports/.."), the dashboard must not resolve its ".."
    dots = NewTask(DOTS_KEY, "report", {}, TaskOption().to_storage(now))
    assert await driver.insert_tasks(InsertParams([dots], now)) == [True]
    await ops.pause("report-weekly")
    # expired: its deadline passes before a worker takes it
    await sender.send(
        Task(
            "resize-late",
            "resize_image",
            {"id": 0},
            option=TaskOption(deadline=now + timedelta(milliseconds=150)),
        )
    )
    await asyncio.sleep(0.3)

    consumer = Consumer(
        driver,
        worker_id=LIVE_WORKER,
        concurrency=4,
        poll_interval=0.05,
        heartbeat_interval=0.2,
        planner=False,
    )
    long_started = asyncio.Event()

    @consumer.handler("resize_image")
    async def resize_image(params: dict[str, Any]) -> dict[str, Any]:
        if params["id"] == 7:
            raise ValueError(f"image {params['id']} is not a JPEG: header b'\\x89PNG' <b>bold?</b>")
        await asyncio.sleep(0.01 * params["id"])
        return {"width": 640, "height": 480}

    @consumer.handler("charge_card")
    async def charge_card(params: dict[str, Any], ctx: TaskContext) -> str:
        if ctx.attempt_no == 1:
            raise InvoiceDeclined("card declined (try again later)")
        return "charged"

    @consumer.handler("import_rows")
    async def import_rows(params: dict[str, Any], ctx: TaskContext) -> int:
        for step in range(1, 4):
            ctx.progress(step / 10, f"{step * 1000} of 10000 rows")  # written with the checkpoint
            await ctx.checkpoint({"done": step, "cursor": f"row-{step * 1000}"})
        long_started.set()
        await asyncio.Event().wait()  # runs until cancelled or the consumer stops
        return 0

    @consumer.handler("fetch")
    async def fetch(params: dict[str, Any]) -> str:
        return "fetched"

    @consumer.handler("transform")
    async def transform(params: dict[str, Any]) -> str:
        return "transformed"

    @consumer.handler("list_pages")
    async def list_pages(params: dict[str, Any]) -> list[int]:
        return [1, 2, 3]

    @consumer.handler("render_page")
    async def render_page(page: int) -> str:
        return f"page-{page}.pdf"

    @consumer.handler("bundle")
    async def bundle(params: dict[str, Any], ctx: TaskContext) -> int:
        return len(ctx.results["render_page"])

    await consumer.start()
    await sender.send_many(
        [Task(f"resize-{n}", "resize_image", {"id": n}, option=quick) for n in range(1, 7)]
        + [
            Task(FAILED_KEY, "resize_image", {"id": 7}, option=quick),
            Task("charge-55", "charge_card", {"invoice": 55}, option=quick),
            Task("etl-2026-11-22", "etl", {"day": "2026-11-22"}, children=["fetch", "transform"]),
            Task(
                WORKFLOW_KEY,
                "book",
                {"title": "November"},
                children=[
                    Child("list_pages"),
                    Child("render_page", map_over="list_pages"),
                    Child("bundle", needs=["render_page"]),
                    Child("fetch", needs=["list_pages"]),
                ],
            ),
            Task(LONG_KEY, "import_rows", {"file": "s3://bucket/2026-11.csv"}),
        ]
    )
    for key in [f"resize-{n}" for n in range(1, 7)] + ["charge-55", "etl-2026-11-22", WORKFLOW_KEY]:
        await _wait_for(ops, key, {TaskStatus.SUCCEEDED})
    await _wait_for(ops, FAILED_KEY, {TaskStatus.FAILED})
    await _wait_for(ops, "resize-late", {TaskStatus.EXPIRED})
    await asyncio.wait_for(long_started.wait(), 10)

    await sender.send(Task("invoice-0999", "send_invoice", {"customer": 999, "amount": 5}))
    await ops.cancel("invoice-0999", "customer withdrew")

    start = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)
    await ops.add_plan(
        Plan(
            plan_id="nightly-report",
            name="report",
            params={"scope": "all"},
            timing=PlanTiming(schedule=CronSchedule(expression="0 3 * * *"), tz="Europe/Paris"),
        )
    )
    await ops.add_plan(
        Plan(
            plan_id="sync-every-15m",
            name="sync_account",
            timing=PlanTiming(schedule=EverySchedule(interval=timedelta(minutes=15), start=start)),
        )
    )
    await ops.add_plan(
        Plan(
            plan_id="cleanup-hourly",
            name="cleanup",
            timing=PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=start)),
            suspended=True,
        )
    )
    await driver.register_worker(
        WorkerInfo(
            IDLE_WORKER, "batch-host-2", 4242, ("send_invoice", "report"), 8, datetime.now(UTC), ("gpu",)
        )
    )
    return Seeded(consumer, long_started)
