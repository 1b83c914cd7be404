"""Playwright driving Debian's Chromium (``/usr/bin/chromium``; scripts/setup.sh installs it): never a browser
download. The flags keep it off the network it would otherwise try (updates, sync, QUIC).

The fixtures (tests/conftest.py loads this module as a plugin): ``browser``, one Chromium per module (not per
session: the sync API's event loop must not outlive the module, others run loops of their own); ``context``, a
fresh one per test, so no cookie or session leaks into the next test; ``page``, a page in that context. Where a
test needs the dashboard's HTTP answers themselves (a redirect's status, a header), ``signed_in_client`` is a
plain HTTP client with a session, no browser."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from openrelay.web.security import SESSION_COOKIE, csrf_for
from tests.support.http_client import ssl_context

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


_CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


@contextlib.contextmanager
def signed_in_client(server: Any, api_key: str | None = None) -> Iterator[tuple[httpx.Client, str]]:
    """An HTTP client signed in to the dashboard as ``api_key`` (the server's own by default), following no
    redirect, and its session's CSRF token; closed on leaving."""
    with httpx.Client(base_url=dashboard_root(server), timeout=60, follow_redirects=False,
                      verify=ssl_context()) as client:
        form = client.get("/login")
        login_token = _CSRF_FIELD.search(form.text)
        assert login_token is not None, form.text[:500]
        done = client.post("/login", data={"api_key": api_key or server.api_key, "csrf": login_token.group(1)})
        assert done.status_code == 303, done.text[:500]
        yield client, csrf_for(client.cookies[SESSION_COOKIE])
