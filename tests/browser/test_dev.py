"""The dashboard of ``mscheduler dev examples.shop:app`` (a subprocess, no MongoDB) in headless
chromium: log in with the printed token, see a task sent over ``POST /api/v1/tasks`` succeed,
open it, and see the example's plan and worker. Loopback only."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.acceptance.support import Running, command
from tests.browser.conftest import SCREENSHOTS

pytestmark = pytest.mark.browser
TOKEN = "dev-browser-token-0123456789"


@pytest.fixture(scope="module")
def dev() -> Iterator[str]:
    proc = Running([*command(), "dev", "examples.shop:app", "--port", "0", "--token", TOKEN])
    try:
        proc.wait_for(r"^Ctrl\+C to stop", timeout=30)
        url = re.search(r"dashboard +(http://127\.0\.0\.1:\d+)/ui/", proc.output)
        assert url is not None, proc.output
        yield url.group(1)
    finally:
        proc.signal(signal.SIGINT)
        code = proc.finish(timeout=20)
        proc.kill()
        assert code == 0, proc.output


def test_the_dev_dashboard_shows_what_was_sent(browser: Any, dev: str) -> None:
    task = {"key": "invoice-7", "name": "send_invoice", "params": {"order_id": 7, "email": "b@c.d"}}
    answer = httpx.post(f"{dev}/api/v1/tasks", json=task, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 201
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{dev}/")
        page.locator("#token").fill(TOKEN)
        page.get_by_role("button", name="Log in").click()
        page.locator("#overview").wait_for()
        assert page.locator("#role").inner_text() == "admin"
        page.evaluate("() => { location.hash = '#/tasks?status=succeeded' }")
        page.locator("#tasks tbody a.task-link", has_text="invoice-7").wait_for()
        page.screenshot(path=str(SCREENSHOTS / "dev-tasks.png"), full_page=True)
        page.locator("#tasks tbody a.task-link", has_text="invoice-7").click()
        page.get_by_text("b@c.d").first.wait_for()  # the result, on the task page
        page.evaluate("() => { location.hash = '#/plans' }")
        page.locator('tr[data-plan="price-report-every-minute"]').wait_for()
        page.evaluate("() => { location.hash = '#/workers' }")
        page.locator("#workers tbody tr").first.wait_for()
        assert "send_invoice" in page.locator("#workers tbody").inner_text()
    finally:
        context.close()
    assert not errors, errors
