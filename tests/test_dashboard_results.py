"""Issue 14 parts 2 and 3 on the dashboard, in a real browser: a running batch's detail page offers its partial
result files (the same bytes as the API's), and an ended batch's page retries its failures as a new batch."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.support.batches import chat, create, org_key, wait_for
from tests.support.browser import dashboard_root, sign_in

pytestmark = pytest.mark.slow  # Chromium

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def test_running_batch_page_downloads_the_partial_files(server, engine, page: Page):
    gate = "dash-partial"
    batch_id = create(server, [chat(f"d{i}", f"page {i} #hold={gate}") for i in range(3)])["id"]
    engine.wait_held(gate, 3)
    engine.release(gate, count=1)
    out_id = f"file-{batch_id}-output"
    wait_for(lambda: server.http("GET", f"/files/{out_id}").json()["openrelay"]["lines"] == 1, "one line")
    sign_in(page, server, server.api_key)
    page.goto(dashboard_root(server) + f"/batches/{batch_id}")
    links = page.locator("#downloads ul.partial a[data-file-id]")
    expect(links).to_have_count(2)
    assert links.first.get_attribute("data-file-id") == out_id
    got = page.request.get(dashboard_root(server) + f"/files/{out_id}/content")
    assert got.status == 200 and got.body() == server.http("GET", f"/files/{out_id}/content").content
    assert got.body().count(b"\n") == 1
    engine.release(gate)
    server.wait(batch_id)
    page.goto(dashboard_root(server) + f"/batches/{batch_id}")
    expect(page.locator("#downloads ul.partial")).to_have_count(0)
    expect(page.locator("form.retry")).to_have_count(0)  # nothing failed


def test_ended_batch_page_retries_its_failures(server, engine, page: Page):
    done = create(server, [chat("fine", "ok"), chat("bad", "no #status=400")])
    server.wait(done["id"])
    sign_in(page, server, server.api_key)
    page.goto(dashboard_root(server) + f"/batches/{done['id']}")
    expect(page.locator("form.retry button")).to_have_text("Retry 1 failed record")
    page.click("form.retry button")
    expect(page.locator("#batch-id")).not_to_have_text(done["id"])
    new_id = page.locator("#batch-id").inner_text()
    made = server.http("GET", f"/batches/{new_id}").json()
    assert made["metadata"] == {"retry_of": done["id"]} and made["request_counts"]["total"] == 1
    # A key of the organization that may not create sees the page without the button.
    reader = org_key(server, server.org, "--scopes", "batch.read,files.read")
    page.context.clear_cookies()
    sign_in(page, server, reader)
    page.goto(dashboard_root(server) + f"/batches/{done['id']}")
    expect(page.locator("#batch-id")).to_have_text(done["id"])
    expect(page.locator("form.retry")).to_have_count(0)
