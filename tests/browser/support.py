"""What the browser tests share: logging in, opening a page and waiting for its render,
screenshots."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from tests.browser.conftest import SCREENSHOTS, DashboardServer


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def login(page: Any, dashboard: DashboardServer, token: str) -> None:
    page.goto(f"{dashboard.url}/")
    page.locator("#token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.locator("#overview").wait_for()


def rendered(page: Any) -> str:
    """The page's render count (``main[data-ready]``), to wait for the next one."""
    return str(page.locator("main").get_attribute("data-ready"))


def wait_rerender(page: Any, before: str) -> None:
    page.locator(f'main[data-ready]:not([data-ready="{before}"])').wait_for()


def apply_filters(page: Any) -> None:
    before = rendered(page)
    page.locator("#apply-filters").click()
    wait_rerender(page, before)


def open_hash(page: Any, hash_: str, ready: str) -> None:
    before = rendered(page)
    page.evaluate("h => { location.hash = h }", hash_)
    wait_rerender(page, before)
    page.locator(ready).first.wait_for()


def task_hash(key: str) -> str:
    return "#/task/" + quote(key, safe="")


def ask(page: Any, button: str) -> None:
    """Click an action ``button`` and wait for its confirmation dialog. A live update may redraw
    the page between finding the button and the click (the click then lands on the old, detached
    button and nothing opens): the click is made again on the redrawn button, up to three times."""
    dialog = page.locator("dialog#confirm[open]")
    for _ in range(3):
        if dialog.count() == 0:
            page.locator(button).first.click()
        try:
            dialog.wait_for(timeout=5000)
            return
        except Exception:  # playwright's TimeoutError: the click did not reach a live button
            continue
    dialog.wait_for()  # fails with playwright's own message
