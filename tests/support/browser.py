"""Playwright driving Debian's Chromium (``/usr/bin/chromium``; scripts/setup.sh installs it): never a browser
download. The flags keep it off the network it would otherwise try (updates, sync, QUIC).

The fixtures (tests/conftest.py loads this module as a plugin): ``browser``, one Chromium per module (not per
session: the sync API's event loop must not outlive the module, others run loops of their own); ``context``, a
fresh one per test, so no cookie or session leaks into the next test; ``page``, a page in that context."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context()
    ctx.set_default_timeout(15_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def dashboard_root(server: Any) -> str:
    return server.base_url.removesuffix("/v1")


def sign_in(page: Page, server: Any, api_key: str) -> None:
    page.goto(dashboard_root(server) + "/login")
    page.fill("input[name=api_key]", api_key)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/(\?.*)?$"))


def csrf_of(page: Page) -> str:
    """The session's CSRF token, as every form of the page carries it (the sign-out form is on every page)."""
    return page.locator("form.logout input[name=csrf]").get_attribute("value") or ""
