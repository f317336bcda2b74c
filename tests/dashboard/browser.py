"""Debian's Chromium driven by Playwright, or a skip that says what is missing.

Playwright's own browser download needs the internet; the tests launch the system's
``chromium`` instead (``apt-get install chromium``; .ci/run installs it when missing).
:func:`enter` opens the local dashboard the way its operator does: through the URL with
the run's key.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.dashboard.conftest import Served

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    """The system Chromium, or None."""
    configured = os.environ.get("LEASEQ_CHROMIUM")
    if configured:
        return configured if os.path.exists(configured) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def launch(extra_args: Sequence[str] = ()) -> Iterator[Any]:
    """Yield a headless browser (with these flags too), or skip the test with the reason."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium on this machine: apt-get install chromium "
                    "(or set LEASEQ_CHROMIUM to a Chromium binary)")
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True,
                                             args=[*args, *extra_args])
        try:
            yield browser
        finally:
            browser.close()


def enter(page: Any, served: Served) -> None:
    """Open the key URL; the browser keeps the cookie and lands on / without the key."""
    page.goto(served.login_url)
    assert page.url == served.url + "/", page.url
