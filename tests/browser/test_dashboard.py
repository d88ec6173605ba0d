"""The dashboard end to end in headless chromium: log in, load every page, filter the task list,
open tasks, cancel one as admin (through the confirmation dialog), be refused as read-only, and
show hostile strings as text. Each page's screenshot lands in ``tests/browser/screenshots/``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mscheduler.domain.model import TaskStatus
from tests.browser.conftest import DashboardServer
from tests.browser.seed import CANCEL_ME, DOTS_KEY, FAILED_KEY, IDLE_WORKER, LONG_KEY, WORKFLOW_KEY, XSS_KEY
from tests.browser.support import (
    apply_filters,
    ask,
    login,
    open_hash,
    rendered,
    shot,
    task_hash,
    wait_rerender,
)
from tests.web.support import ADMIN_TOKEN, READ_TOKEN

pytestmark = pytest.mark.browser


def test_login_and_every_page(page: Any, dashboard: DashboardServer) -> None:
    page.goto(f"{dashboard.url}/")
    assert page.url.endswith("/ui/")  # / leads to the dashboard
    page.locator("#login").wait_for()
    shot(page, "login")
    page.locator("#token").fill("not-a-token-of-this-server")
    page.get_by_role("button", name="Log in").click()
    page.locator("#login-error", has_text="The token was refused").wait_for()

    login(page, dashboard, ADMIN_TOKEN)
    assert page.locator("#role").inner_text() == "admin"
    counts = dashboard.run(dashboard.operations.count_by_status())
    for status in ("pending", "running", "succeeded", "failed", "expired", "cancelled"):
        card = page.locator(f'#status-counts a[data-status="{status}"] .n')
        assert card.inner_text() == str(counts.get(status, 0)), status
    assert page.locator("#throughput-chart rect.ok").count() >= 1
    assert page.locator("#throughput-chart rect.bad").count() >= 1
    assert page.locator("#failure-chart circle.dot").count() >= 1
    assert re.match(r"[\d.]+ (ms|s) · (send_invoice|report)\n", page.locator("#oldest-pending").inner_text())
    assert page.locator("#overview").get_by_text("worker-live-1").count() == 1
    acme = page.locator('#by-key tr[data-key="acme"]')
    assert re.match(r"acme\s+2\s+[\d.]+ (ms|s)", acme.inner_text()), acme.inner_text()
    shot(page, "overview")
    page.emulate_media(color_scheme="dark")
    shot(page, "overview-dark")
    page.emulate_media(color_scheme="light")

    page.get_by_role("link", name="Tasks", exact=True).click()
    page.locator("#tasks table").wait_for()
    assert page.locator("#tasks tbody tr").count() == sum(counts.values())
    shot(page, "tasks")

    page.get_by_role("link", name="Plans", exact=True).click()
    page.locator("#plans table").wait_for()
    rows = page.locator("#plans tbody tr")
    assert rows.count() == 3
    nightly = page.locator('tr[data-plan="nightly-report"]')
    assert "0 3 * * *" in nightly.inner_text() and "Europe/Paris" in nightly.inner_text()
    assert nightly.locator("time").count() >= 1  # its next fire time
    assert "suspended" in page.locator('tr[data-plan="cleanup-hourly"]').inner_text()
    shot(page, "plans")

    page.get_by_role("link", name="Workers", exact=True).click()
    page.locator("#workers table").wait_for()
    live = page.locator('tr[data-worker="worker-live-1"]')
    assert "1 / 4" in live.inner_text() and "live" in live.inner_text()
    assert "groups" not in live.inner_text()
    assert page.locator(f'tr[data-worker="{IDLE_WORKER}"] [data-groups]').inner_text() == "groups: gpu"
    shot(page, "workers")


def test_filter_the_task_list_and_page_on(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, "#/tasks", "#task-filters")
    page.select_option("#f-status", "failed")
    apply_filters(page)
    assert "status=failed" in page.url
    keys = page.locator("#tasks tbody a.task-link").all_inner_texts()
    assert keys == [FAILED_KEY]
    shot(page, "tasks-failed")

    page.locator("#f-status").select_option("")
    page.locator("#f-name").fill("resize_image")
    page.locator("#f-key_prefix").fill("resize-")
    apply_filters(page)
    assert "key_prefix=resize-" in page.url
    keys = page.locator("#tasks tbody a.task-link").all_inner_texts()
    assert keys == sorted(keys) and len(keys) == 8 and "resize-late" in keys

    page.locator("#f-worker_id").fill("worker-live-1")
    apply_filters(page)
    assert "worker_id=worker-live-1" in page.url
    assert page.locator("#tasks tbody tr").count() == 7
    assert "resize-late" not in page.locator("#tasks tbody").inner_text()  # never attempted

    # cursor paging, three at a time
    open_hash(page, "#/tasks?key_prefix=resize-&limit=3", "#next-page")
    first = page.locator("#tasks tbody a.task-link").all_inner_texts()
    before = rendered(page)
    page.locator("#next-page").click()
    wait_rerender(page, before)
    page.locator("#prev-page").wait_for()
    second = page.locator("#tasks tbody a.task-link").all_inner_texts()
    assert len(first) == len(second) == 3 and first[-1] < second[0]
    before = rendered(page)
    page.locator("#prev-page").click()  # and back: the first page again
    wait_rerender(page, before)
    assert page.locator("#tasks tbody a.task-link").all_inner_texts() == first
    assert page.locator("#prev-page").count() == 0

    # a created range that holds nothing
    open_hash(page, "#/tasks", "#task-filters")
    page.locator("#f-created_from").fill("2001-01-01T00:00")
    page.locator("#f-created_to").fill("2001-01-02T00:00")
    apply_filters(page)
    assert "created_from=2001-01-0" in page.url  # local time, sent in UTC
    page.get_by_text("No task matches these filters.").wait_for()

    # a finished range: finished tasks only, newest finish first, with their finish times shown
    open_hash(page, "#/tasks", "#task-filters")
    page.locator("#f-finished_from").fill("2001-01-01T00:00")
    apply_filters(page)
    assert "finished_from=2001-01-0" in page.url
    page.get_by_text("finish time, newest first").wait_for()
    listed = page.locator("#tasks tbody a.task-link").all_inner_texts()
    assert FAILED_KEY in listed and "resize-late" in listed and "invoice-1001" not in listed
    finished = page.locator("#tasks tbody td:nth-child(10) time").evaluate_all(
        "els => els.map((e) => e.getAttribute('datetime'))"
    )
    assert len(finished) == len(listed) and finished == sorted(finished, reverse=True)


def test_open_a_task_from_the_list(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, f"#/tasks?key_prefix={FAILED_KEY}", "a.task-link")
    page.locator("a.task-link", has_text=FAILED_KEY).click()
    page.locator("#task").wait_for()
    assert page.locator("#task-key").inner_text() == FAILED_KEY
    attempts = page.locator("tr[data-attempt]")
    assert attempts.count() == 2  # the first try and its one retry
    assert "worker-live-1" in attempts.nth(0).inner_text()
    assert "ValueError: image 7 is not a JPEG" in attempts.nth(1).inner_text()
    assert "<b>bold?</b>" in attempts.nth(1).inner_text()  # markup in an error stays text
    attempts.nth(1).locator("summary", has_text="traceback").click()
    assert "Traceback" in attempts.nth(1).locator("pre.traceback").inner_text()
    assert page.locator("#attempt-timeline rect.bar.failed").count() == 2
    events = page.locator("section", has=page.locator("h2", has_text="Events"))
    assert "retried" in events.inner_text() and "failed" in events.inner_text()
    shot(page, "task-failed")

    open_hash(page, task_hash(LONG_KEY), "#progress")
    assert "3000 of 10000 rows" in page.locator("#task").inner_text()
    checkpoint = page.locator("section", has=page.locator("h2", has_text="Checkpoint"))
    assert '"cursor": "row-3000"' in checkpoint.inner_text()
    assert page.locator("#attempt-timeline rect.bar.running").count() == 1
    shot(page, "task-long")

    open_hash(page, task_hash("etl-2026-11-22"), "#task")
    children = page.locator("section", has=page.locator("h2", has_text="Children"))
    assert children.locator("tr").count() == 3
    children.get_by_role("link", name="etl-2026-11-22/transform").click()
    page.locator("#task-key", has_text="etl-2026-11-22/transform").wait_for()
    shot(page, "task-child")

    open_hash(page, task_hash(WORKFLOW_KEY), "#workflow-graph")
    steps = page.locator("#workflow-graph a.step")
    assert steps.count() == 4
    assert [steps.nth(i).get_attribute("data-status") for i in range(4)] == ["succeeded"] * 4
    assert "3 items: 3 succeeded" in (page.locator("#workflow-graph").text_content() or "")
    assert page.locator("#workflow-graph path.edge").count() == 3
    assert page.locator("#workflow-graph path.edge.map").count() == 1
    shot(page, "task-workflow")
    page.locator('#workflow-graph a.step[data-step="bundle"]').click()
    page.locator("#task-key", has_text=f"{WORKFLOW_KEY}/bundle").wait_for()


def test_admin_cancels_a_task_after_confirming(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, task_hash(CANCEL_ME), "#task-actions")
    assert page.locator("#task .badge").first.inner_text() == "pending"
    ask(page, 'button[data-action="cancel"]')
    dialog = page.locator("dialog#confirm")
    dialog.wait_for()
    assert CANCEL_ME in dialog.inner_text()
    page.locator("#confirm-reason").fill("customer paid by wire")
    shot(page, "task-cancel-confirm")
    page.locator("#confirm-no").click()  # backing out changes nothing
    assert dashboard.run(dashboard.operations.get_task(CANCEL_ME)).status is TaskStatus.PENDING

    ask(page, 'button[data-action="cancel"]')
    page.locator("#confirm-reason").fill("customer paid by wire")
    page.locator("#confirm-yes").click()
    page.locator("#banner.info", has_text=f"Cancelled {CANCEL_ME}").wait_for()
    page.locator("#task .title-row .badge", has_text="cancelled").wait_for()
    assert "customer paid by wire" in page.locator("#task").inner_text()
    task = dashboard.run(dashboard.operations.get_task(CANCEL_ME))
    assert (
        task.status is TaskStatus.CANCELLED
        and task.cancelled
        and task.cancelled["reason"] == "customer paid by wire"
    )
    shot(page, "task-cancelled")

    # only what its status allows: a cancelled task can be restarted or removed, not paused
    shown = page.locator("#task-actions button").evaluate_all("els => els.map((e) => e.dataset.action)")
    assert shown == ["restart", "mark-succeeded", "remove"]

    # set a status by hand, with a reason (Operations.set_status)
    open_hash(page, task_hash("invoice-1002"), "#task-actions")
    ask(page, 'button[data-action="mark-failed"]')
    page.locator("#confirm-reason").fill("customer closed the account")
    page.locator("#confirm-yes").click()
    page.locator("#banner.info", has_text="Set invoice-1002 failed").wait_for()
    page.locator("#task .title-row .badge", has_text="failed").wait_for()
    marked = dashboard.run(dashboard.operations.get_task("invoice-1002"))
    assert marked.status is TaskStatus.FAILED and marked.marked is not None
    assert (marked.marked["reason"], marked.marked["by"]) == ("customer closed the account", "api:admin-1")

    # remove: asked first, then back to the list
    open_hash(page, task_hash("invoice-0999"), "#task-actions")
    ask(page, 'button[data-action="remove"]')
    page.locator("#confirm-yes").click()
    page.locator("#banner.info", has_text="Removed invoice-0999").wait_for()
    page.locator("#tasks table").wait_for()
    assert "invoice-0999" not in page.locator("#tasks").inner_text()

    # plans: suspend one, then skip the next two occurrences of another
    row = 'tr[data-plan="sync-every-15m"]'
    open_hash(page, "#/plans", f'{row} button[data-action="suspend"]')
    ask(page, f'{row} button[data-action="suspend"]')
    page.locator("#confirm-yes").click()
    page.locator(f"{row} .badge", has_text="suspended").wait_for()
    ask(page, 'tr[data-plan="nightly-report"] button[data-action="skip"]')
    page.locator("#confirm-n").fill("2")
    page.locator("#confirm-yes").click()
    page.locator("#banner.info", has_text="skips its next 2").wait_for()
    assert dashboard.run(dashboard.operations.get_plan("nightly-report")).skip_next == 2

    # workers: stop the idle one
    open_hash(page, "#/workers", f'tr[data-worker="{IDLE_WORKER}"] button[data-action="stop"]')
    ask(page, f'tr[data-worker="{IDLE_WORKER}"] button[data-action="stop"]')
    page.locator("#confirm-yes").click()
    page.locator(f'tr[data-worker="{IDLE_WORKER}"] .badge', has_text="stopping").wait_for()


def test_read_only_sees_no_actions_and_is_refused(page: Any, dashboard: DashboardServer) -> None:
    login(page, dashboard, READ_TOKEN)
    assert page.locator("#role").inner_text() == "read (read-only)"
    for hash_, ready in (
        (task_hash(LONG_KEY), "#task"),
        ("#/plans", "#plans table"),
        ("#/workers", "#workers table"),
    ):
        open_hash(page, hash_, ready)
        assert page.locator("button[data-action]").count() == 0, hash_
    shot(page, "workers-read-only")

    # a forced change with the read token: the API's 403, said plainly
    status = page.evaluate(
        """async ([key, token]) => (await fetch(`../api/v1/tasks/${encodeURIComponent(key)}/cancel`,
            {method: "POST", headers: {Authorization: `Bearer ${token}`}})).status""",
        [LONG_KEY, READ_TOKEN],
    )
    assert status == 403
    # and through the page: buttons drawn for an admin, then the tab's token is a read token
    page.evaluate("t => sessionStorage.setItem('mscheduler.token', t)", ADMIN_TOKEN)
    page.reload()
    page.locator("main[data-ready]").wait_for()
    open_hash(page, task_hash(LONG_KEY), "#task-actions")
    page.evaluate("t => sessionStorage.setItem('mscheduler.token', t)", READ_TOKEN)
    ask(page, 'button[data-action="cancel"]')
    page.locator("#confirm-yes").click()
    banner = page.locator("#banner.error")
    banner.wait_for()
    assert "this token may only read; changes need an admin token" in banner.inner_text()
    page.locator("#role", has_text="read-only").wait_for()  # the page asked again: no more buttons
    assert page.locator("button[data-action]").count() == 0
    assert dashboard.run(dashboard.operations.get_task(LONG_KEY)).status is TaskStatus.RUNNING
    shot(page, "task-refused-read-only")


def test_hostile_strings_are_shown_as_text(page_without_csp: Any, dashboard: DashboardServer) -> None:
    page = page_without_csp  # were the key markup, its onerror would run (and fail the test)
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, "#/tasks?name=report", "a.task-link")
    assert XSS_KEY in page.locator("#tasks tbody").inner_text()
    assert page.locator("main img").count() == 0
    page.locator("a.task-link", has_text="onerror").click()
    page.locator("#task").wait_for()
    assert page.locator("#task-key").inner_text() == XSS_KEY
    assert "<script>alert('params')</script>" in page.locator("#params pre").inner_text()
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("document.querySelectorAll('[onerror]').length") == 0
    shot(page, "task-hostile-key")


def test_a_key_a_url_cannot_hold_is_refused_not_taken_for_another(
    page: Any, dashboard: DashboardServer
) -> None:
    login(page, dashboard, ADMIN_TOKEN)
    before = rendered(page)
    page.evaluate("h => { location.hash = h }", task_hash(DOTS_KEY))
    wait_rerender(page, before)
    assert "cannot be used in a URL" in page.locator("#banner.error").inner_text()
    assert page.locator("#task, button[data-action]").count() == 0  # not invoice-1001's page


def test_a_change_on_a_page_that_went_stale_gets_the_apis_refusal(
    page: Any, dashboard: DashboardServer
) -> None:
    # no event stream for this tab (as if the store recorded none): the page polls, every 10 s
    page.route(
        "**/api/v1/events/stream*",
        lambda route: route.fulfill(status=409, json={"error": "event_log_off", "detail": "off"}),
    )
    login(page, dashboard, ADMIN_TOKEN)
    page.locator("#live[data-state=polling]").wait_for()
    open_hash(page, task_hash("report-weekly"), "#task-actions")
    assert page.locator('button[data-action="resume"]').count() == 1  # paused
    dashboard.run(dashboard.operations.cancel("report-weekly", "meanwhile, elsewhere"))
    page.locator('button[data-action="resume"]').click()
    page.locator("#banner.error", has_text="HTTP 409").wait_for()
    assert "a finished task cannot be resumed" in page.locator("#banner").inner_text()
