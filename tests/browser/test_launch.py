"""An installed chromium that cannot be launched fails the browser tests; it does not skip them."""

from __future__ import annotations

import pytest

from tests.browser.conftest import chromium_path, launch_chromium


def test_a_chromium_that_cannot_launch_fails_the_run() -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if chromium_path() is None:
        pytest.skip("no chromium installed here: the browser tests skip (`make browser`)")
    with sync_api.sync_playwright() as playwright:
        with pytest.raises(pytest.fail.Exception, match="could not be launched"):
            launch_chromium(playwright, "/bin/false")  # an executable that is no browser
