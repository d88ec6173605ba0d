"""The dashboard in a real headless browser: Debian's chromium driven by Playwright.

The app runs under uvicorn on a free localhost port, in a thread with its own event loop, over a
MemoryDriver that ``seed`` filled (tasks of every status, plans, workers, a live consumer).
Playwright launches the system's chromium (``make browser`` installs it; Playwright's own browser
downloads are never used: the machines are offline). Without chromium the tests skip and say why;
with chromium installed, a chromium that cannot be launched (or a missing Playwright) fails them
all: a broken browser must not pass for a machine without one. Screenshots of every page go to
``tests/browser/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mscheduler import MemoryDriver, Operations
from mscheduler.web import create_app
from tests.browser.seed import seed
from tests.web.support import TOKENS

T = TypeVar("T")
SCREENSHOTS = Path(__file__).parent / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """``MSCHEDULER_CHROMIUM``, else Debian's ``/usr/bin/chromium``, else one on the PATH."""
    for candidate in (os.environ.get("MSCHEDULER_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DashboardServer:
    """The app over a seeded store, served by uvicorn in a background thread."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: Any = None
        self.thread = threading.Thread(target=self._run, name="dashboard-server", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start()
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        import uvicorn

        self.loop = asyncio.get_running_loop()
        self.driver = MemoryDriver(events=True)
        self.operations = Operations(self.driver)
        seeded = await seed(self.driver)
        app = create_app(operations=self.operations, tokens=TOKENS, metrics=False)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        serving = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        # uvicorn has no event for "listening": its flag is polled
        while not self.server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        self.ready.set()
        try:
            await serving
        finally:
            await seeded.consumer.stop(grace=0)

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the dashboard server did not start in 30 s")
        if self.error is not None:
            raise RuntimeError("the dashboard server failed to start") from self.error

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine in the server's loop (to read the store the pages show)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)


def launch_chromium(playwright: Any, executable: str) -> Any:
    """The installed chromium at ``executable``, launched; fails the test if it cannot be."""
    try:
        return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
    except Exception as exc:
        pytest.fail(f"chromium is installed at {executable} but could not be launched: {exc}", pytrace=False)


# Module scope, not session: while a sync Playwright is open the thread counts as running an
# event loop, which would break every asyncio test that came after it in the session.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("no chromium found (/usr/bin/chromium): run `make browser` (apt-get install chromium)")
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail(f"chromium is installed at {executable} but Playwright is not: pip install -e '.[dev]'")
    with sync_api.sync_playwright() as playwright:
        browser = launch_chromium(playwright, executable)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def dashboard(browser: Any) -> Iterator[DashboardServer]:
    server = DashboardServer()
    server.start()
    SCREENSHOTS.mkdir(exist_ok=True)
    yield server
    server.stop()


def _page(browser: Any, **options: Any) -> Iterator[Any]:
    """A fresh tab (its own sessionStorage: logged out); fails the test on a JavaScript error,
    and on any JavaScript dialog (``alert``: what an injected script would open)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, **options)
    page = context.new_page()
    page.set_default_timeout(5000)
    # a first load fetches the scripts and styles from a server that shares 2 cores with the
    # rest of the suite: it gets longer than a wait for a render
    page.set_default_navigation_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("dialog", lambda dialog: errors.append(f"a JavaScript dialog opened: {dialog.message}"))
    page.js_errors = errors
    yield page
    context.close()
    # 401/403/409 answers the tests provoke are logged by chromium as failed loads: not errors
    unexpected = [e for e in errors if "the server responded with a status of" not in e]
    assert not unexpected, unexpected


@pytest.fixture
def page(browser: Any, dashboard: DashboardServer) -> Iterator[Any]:
    yield from _page(browser)


@pytest.fixture
def page_without_csp(browser: Any, dashboard: DashboardServer) -> Iterator[Any]:
    """A tab that ignores the dashboard's Content-Security-Policy: escaping must hold alone."""
    yield from _page(browser, bypass_csp=True)
