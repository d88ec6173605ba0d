"""The operator's console (issue 20, part A) in headless chromium: live updates from the event
stream (and polling when it is refused), sorting, the error column, previous / next pages, the
key search in the header, bulk actions over a selection and over a filter of 500 tasks, only the
buttons a status allows, the workers' running tasks and stale workers, the plans' next fire times,
last runs and run-now, an unknown route, and every page at 420 px without page overflow.
Screenshots at 1400 and 420 px land in ``tests/browser/screenshots/``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler import Consumer, Publisher, Task
from mscheduler.domain.model import TaskStatus
from mscheduler.drivers.base import WorkerInfo
from mscheduler.runtime.consumer import TaskContext
from tests.browser.conftest import DashboardServer
from tests.browser.seed import FAILED_KEY, LIVE_WORKER, LONG_KEY
from tests.browser.support import ask, login, open_hash, rendered, shot, task_hash, wait_rerender
from tests.web.support import ADMIN_TOKEN, READ_TOKEN

pytestmark = pytest.mark.browser

STALE_WORKER = "worker-gone-3"
BULK_NAME = "bulk_mail"
BULK_COUNT = 500


def both_widths(page: Any, name: str) -> None:
    """A screenshot at 1400 px and one at 420 px (the page must not overflow there)."""
    shot(page, f"{name}-1400")
    page.set_viewport_size({"width": 420, "height": 900})
    page.wait_for_timeout(50)  # a layout pass
    assert page.evaluate("document.documentElement.scrollWidth") <= 420, f"{name}: wider than the screen"
    shot(page, f"{name}-420")
    page.set_viewport_size({"width": 1400, "height": 900})


def updated(page: Any) -> int:
    return int(page.locator("main").get_attribute("data-updated") or 0)


def test_live_updates_arrive_without_a_reload(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    page.locator("#live[data-state=live]").wait_for()
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    # the overview's counters move
    pending = page.locator('#status-counts a[data-status="pending"] .n')
    before = int(pending.inner_text())
    dashboard.run(Publisher(dashboard.driver).send(Task("live-new-1", "send_invoice", {"n": 1})))
    page.locator(f'#status-counts a[data-status="pending"] .n:text-is("{before + 1}")').wait_for()

    # the task list: a new task appears at the top, a status changes in place
    open_hash(page, "#/tasks", "#task-table")
    ready = rendered(page)
    dashboard.run(Publisher(dashboard.driver).send(Task("live-new-2", "send_invoice", {"n": 2})))
    page.locator('#task-table tbody tr[data-key="live-new-2"]').wait_for()
    assert (
        page.locator("#task-table tbody tr").first.get_attribute("data-key") == "live-new-2"
    )  # newest first
    dashboard.run(dashboard.operations.cancel("live-new-1", "changed my mind"))
    page.locator('tr[data-key="live-new-1"][data-status="cancelled"]').wait_for()
    assert rendered(page) == ready  # drawn in place, not a new page
    assert updated(page) >= 2

    # a task's page follows its own events
    open_hash(page, task_hash("live-new-2"), "#task-actions")
    dashboard.run(dashboard.operations.pause("live-new-2"))
    page.locator('#task .title-row .badge:text-is("paused")').wait_for()
    assert page.evaluate("window.__sameDocument") is True
    both_widths(page, "live-task")


def test_a_refused_stream_falls_back_to_polling(page: Any, dashboard: DashboardServer) -> None:
    page.route(
        "**/api/v1/events/stream*",
        lambda route: route.fulfill(
            status=429,
            headers={"Retry-After": "60"},
            json={"error": "too_many_streams", "detail": "this token holds 8 event streams"},
        ),
    )
    login(page, dashboard, READ_TOKEN)
    live = page.locator("#live[data-state=polling]")
    live.wait_for()
    assert live.inner_text() == "polling" and "8 event streams" in str(live.get_attribute("title"))


def test_sort_search_error_column_and_paging(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    # the key search in the header, from any page
    open_hash(page, "#/workers", "#workers table")
    before = rendered(page)
    page.locator("#search-key").fill("resize-")
    page.locator("#search-key").press("Enter")
    wait_rerender(page, before)
    assert (
        "key_prefix=resize-" in page.url and page.locator("#tasks-hint", has_text="in key order").count() == 1
    )
    keys = page.locator("#task-table tbody tr").evaluate_all("rows => rows.map((r) => r.dataset.key)")
    assert keys == sorted(keys) and FAILED_KEY in keys
    # the error column: the last error's first line
    failed = page.locator(f'tr[data-key="{FAILED_KEY}"] td.error-cell')
    assert failed.inner_text().startswith("ValueError: image 7 is not a JPEG")
    both_widths(page, "tasks-search")

    # sort by a column: most attempts first, then the other way
    open_hash(page, "#/tasks", "#task-table")
    before = rendered(page)
    page.locator('th a.sort[data-sort="attempts"]').click()
    wait_rerender(page, before)
    assert "sort=-attempts" in page.url
    attempts = [int(t) for t in page.locator("#task-table tbody td:nth-child(5)").all_inner_texts()]
    assert attempts == sorted(attempts, reverse=True) and attempts[0] >= 2
    before = rendered(page)
    page.locator('th a.sort[data-sort="attempts"]').click()
    wait_rerender(page, before)
    assert "sort=attempts" in page.url and "sort=-attempts" not in page.url
    shot(page, "tasks-sorted")

    # the page size and previous / next pages
    open_hash(page, "#/tasks?sort=name&limit=5", "#next-page")
    first = page.locator("#task-table tbody tr").evaluate_all("rows => rows.map((r) => r.dataset.key)")
    assert len(first) == 5
    before = rendered(page)
    page.locator("#next-page").click()
    wait_rerender(page, before)
    before = rendered(page)
    page.locator("#prev-page").click()
    wait_rerender(page, before)
    assert (
        page.locator("#task-table tbody tr").evaluate_all("rows => rows.map((r) => r.dataset.key)") == first
    )


def test_only_what_can_be_done_is_offered(page: Any, dashboard: DashboardServer) -> None:
    async def succeed_with_progress() -> None:
        consumer = Consumer(dashboard.driver, worker_id="worker-progress", poll_interval=0.05, planner=False)

        @consumer.handler("report_pdf")
        async def report_pdf(params: Any, ctx: TaskContext) -> str:
            ctx.progress(0.4, "page 4 of 10")
            await ctx.checkpoint({"page": 4})
            return "done"

        async with consumer:
            await Publisher(dashboard.driver).send(Task("pdf-1", "report_pdf", {}))
            for _ in range(500):
                if (await dashboard.operations.get_task("pdf-1")).status is TaskStatus.SUCCEEDED:
                    return
                await asyncio.sleep(0.01)

    dashboard.run(succeed_with_progress())
    login(page, dashboard, ADMIN_TOKEN)
    actions = {
        FAILED_KEY: ["restart", "mark-succeeded", "remove"],  # failed: no cancel, pause, resume
        LONG_KEY: ["cancel", "pause", "remove"],  # running: remove means cancel first
        "pdf-1": ["rerun", "remove"],  # succeeded: run again (restart with force), or remove
        "report-weekly": ["cancel", "resume", "mark-succeeded", "mark-failed", "remove"],  # paused
    }
    for key, expected in actions.items():
        open_hash(page, task_hash(key), "#task")
        shown = page.locator("#task-actions button").evaluate_all("els => els.map((e) => e.dataset.action)")
        assert shown == expected, key
    # a finished attempt shows no retry time; a succeeded task is at 100 %
    open_hash(page, task_hash(FAILED_KEY), "#task")
    assert page.locator("tr[data-attempt] td:nth-child(6) time").count() == 0
    open_hash(page, task_hash("pdf-1"), "#progress")
    progress = page.locator("section", has=page.locator("h2", has_text="Progress"))
    assert "100 %" in progress.inner_text()
    both_widths(page, "task-succeeded")
    open_hash(page, "#/tasks?name=report_pdf", "#task-table")
    assert page.locator('tr[data-key="pdf-1"] td:last-child').inner_text() == "100 %"
    # an unknown route, and a task that does not exist
    open_hash(page, "#/nowhere", "#not-found")
    assert "Not found" in page.locator("#not-found").inner_text()
    open_hash(page, task_hash("no-such-task"), "#not-found")
    assert "no-such-task" in page.locator("#not-found").inner_text()
    both_widths(page, "not-found")


def test_bulk_actions_on_a_selection_say_what_happened_to_each(page: Any, dashboard: DashboardServer) -> None:
    dashboard.run(
        Publisher(dashboard.driver).send_many([Task(f"sel-{i}", "select_me", {}) for i in range(4)])
    )
    dashboard.run(dashboard.operations.cancel("sel-3"))
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, "#/tasks?name=select_me&sort=key", "#task-table")
    for key in ("sel-0", "sel-1", "sel-3"):
        page.locator(f'tr[data-key="{key}"] input.pick-row').check()
    assert page.locator("#bulk-count").inner_text() == "3 selected"
    buttons = page.locator("#bulk-bar button").evaluate_all("els => els.map((e) => e.dataset.bulk)")
    assert buttons == ["cancel", "pause", "restart", "remove"]  # what applies to at least one
    page.locator('#bulk-bar button[data-bulk="cancel"]').click()
    assert page.locator("#confirm-count").inner_text() == "3 tasks"
    page.locator("#confirm-reason").fill("duplicates")
    page.locator("#confirm-yes").click()
    page.locator("#banner.info", has_text="1 refused").wait_for()
    outcomes = page.locator("#bulk-outcomes tbody tr")
    assert outcomes.count() == 3
    refused = page.locator('#bulk-outcomes tr[data-outcome="refused"]')
    assert refused.get_attribute("data-key") == "sel-3"
    assert "it is cancelled: only a pending or running task can be cancelled" in refused.inner_text()
    statuses = {
        k: dashboard.run(dashboard.operations.get_task(k)).status.value for k in ("sel-0", "sel-1", "sel-2")
    }
    assert statuses == {"sel-0": "cancelled", "sel-1": "cancelled", "sel-2": "pending"}
    both_widths(page, "tasks-bulk-selection")


def test_a_bulk_cancel_of_a_filter_of_500_tasks_runs_on_the_server_with_progress(
    page: Any, dashboard: DashboardServer
) -> None:
    tasks = [Task(f"mail-{i:04}", BULK_NAME, {"to": i}) for i in range(BULK_COUNT)]
    dashboard.run(Publisher(dashboard.driver).send_many(tasks))
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, f"#/tasks?name={BULK_NAME}&status=pending", "#select-matching")
    assert page.locator("#task-table tbody tr").count() == 50  # one page of them
    page.locator("#select-matching").click()
    page.locator("#bulk-count", has_text=f"All {BULK_COUNT} tasks").wait_for()
    assert page.locator("#task-table input.pick-row:checked").count() == 50
    offered = page.locator("#bulk-bar button").evaluate_all("els => els.map((e) => e.dataset.bulk)")
    assert offered == ["cancel", "pause", "resume", "remove"]  # what pending tasks allow
    page.locator('#bulk-bar button[data-bulk="cancel"]').click()
    assert page.locator("#confirm-count").inner_text() == f"{BULK_COUNT} tasks"
    assert f"name {BULK_NAME}" in page.locator("#confirm-text").inner_text()
    shot(page, "tasks-bulk-confirm")
    page.locator("#confirm-reason").fill("campaign withdrawn")
    page.locator("#confirm-yes").click()
    page.locator("#bulk-progress").wait_for()
    page.locator('#bulk-progress[data-state="done"]').wait_for(timeout=30_000)
    page.locator("#banner.info", has_text=f"{BULK_COUNT} done, 0 refused").wait_for()
    assert page.locator("#bulk-outcomes tbody tr").count() == BULK_COUNT
    counts = dashboard.run(dashboard.operations.count_tasks(name=BULK_NAME, status="cancelled"))
    assert counts.count == BULK_COUNT
    sample = dashboard.run(dashboard.operations.get_task("mail-0123"))
    assert sample.cancelled is not None and sample.cancelled["by"] == "api:admin-1"
    both_widths(page, "tasks-bulk-filter")


def test_workers_show_their_running_tasks_and_stale_ones_are_marked(
    page: Any, dashboard: DashboardServer
) -> None:
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    dashboard.run(
        dashboard.driver.register_worker(WorkerInfo(STALE_WORKER, "lost-host", 77, ("report",), 2, long_ago))
    )
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, "#/workers", "#workers table")
    stale = page.locator(f'tr[data-worker="{STALE_WORKER}"]')
    assert stale.get_attribute("class") == "stale" and "no heartbeat for" in stale.inner_text()
    assert "stale" in page.locator("#workers h2").inner_text()
    live = page.locator(f'tr[data-worker="{LIVE_WORKER}"]')
    live.locator("summary").click()
    live.locator(f'li[data-key="{LONG_KEY}"]').wait_for()
    both_widths(page, "workers")


def test_plans_show_their_next_fire_times_last_runs_and_run_now(
    page: Any, dashboard: DashboardServer
) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, "#/plans", "#plans table")
    nightly = page.locator('tr[data-plan="nightly-report"]')
    assert nightly.locator('[data-upcoming="nightly-report"] li').count() == 5
    times = nightly.locator("[data-upcoming] time").evaluate_all(
        "els => els.map((e) => e.getAttribute('datetime'))"
    )
    assert times == sorted(times) and len(set(times)) == 5
    suspended = page.locator('tr[data-plan="cleanup-hourly"]')
    assert suspended.locator("button").evaluate_all("els => els.map((e) => e.dataset.action)") == [
        "resume",
        "run-now",
        "skip",
    ]
    ask(page, 'tr[data-plan="nightly-report"] button[data-action="run-now"]')
    page.locator("#confirm-yes").click()
    page.locator("#banner.info", has_text="a run was made now").wait_for()
    nightly = page.locator('tr[data-plan="nightly-report"]')
    nightly.locator("summary", has_text="last runs").click()
    runs = nightly.locator('[data-runs="nightly-report"] li')
    runs.first.wait_for()
    assert runs.count() == 1 and "pending" in runs.first.inner_text()
    both_widths(page, "plans")


def test_every_page_fits_a_small_screen(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, READ_TOKEN)
    page.set_viewport_size({"width": 420, "height": 900})
    for hash_, ready, name in (
        ("#/", "#overview", "overview"),
        ("#/tasks", "#task-table", "tasks"),
        (task_hash(FAILED_KEY), "#task", "task-failed"),
        (task_hash(LONG_KEY), "#progress", "task-long"),
        ("#/plans", "#plans table", "plans"),
        ("#/workers", "#workers table", "workers"),
    ):
        open_hash(page, hash_, ready)
        assert page.evaluate("document.documentElement.scrollWidth") <= 420, hash_
        if page.locator("main .table-wrap").count():  # a wide table scrolls inside its box
            box = page.locator("main .table-wrap").first
            assert box.evaluate("e => getComputedStyle(e).overflowX") == "auto"
        shot(page, f"{name}-420")
    page.set_viewport_size({"width": 1400, "height": 900})
    open_hash(page, "#/", "#overview")
    shot(page, "overview-1400")
