"""Issue 22 part 6 on the batch page, in a real browser against a real `orl serve` and the test engine: a running
batch's window end reads as the future time it is; a live cancel brings Downloads (and the actions) up to date
with the rest of the live section, without a reload; the record browser says what each answer was; money reads
in significant digits."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from tests.support.batches import EMBEDDINGS, chat, create, embed, wait_letting_held_through
from tests.support.browser import dashboard_root, sign_in

pytestmark = pytest.mark.slow  # Chromium

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)
IN_FLIGHT = 8  # the test catalog's concurrency: this many records of a batch run at once


def test_a_running_batch_shows_its_window_ahead_and_a_live_cancel_updates_its_downloads(server, engine,
                                                                                         page: Page):
    gate = f"window-{time.monotonic_ns()}"
    batch_id = create(server, [chat(f"w{i}", f"wait #hold={gate}") for i in range(IN_FLIGHT + 2)])["id"]
    engine.wait_held(gate, IN_FLIGHT)  # the rest never start: they end as batch_cancelled error lines
    sign_in(page, server, server.api_key)
    page.goto(dashboard_root(server) + f"/batches/{batch_id}")
    live = page.locator("#batch-live")
    expect(live).to_have_attribute("data-status", "running")
    window = live.locator("li[data-step='window ends']")
    expect(window).to_have_class("pending")
    expect(window.locator("time")).to_have_text(re.compile(r"^in 23h 5\dm$"))  # not "just now +24h 00m"
    expect(window.locator(".took")).to_have_count(0)

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form.cancel button")
    expect(live).to_have_attribute("data-status", "cancelling")
    expect(page.locator("#downloads ul.partial")).to_have_count(1)
    page.evaluate("window.__sameDocument = true")
    ended = wait_letting_held_through(server, engine, gate, batch_id)
    assert ended["status"] == "cancelled" and ended["output_file_id"] and ended["error_file_id"]

    expect(live).to_have_attribute("data-status", "cancelled")
    downloads = page.locator("#downloads")
    expect(downloads.locator("ul.partial")).to_have_count(0)
    expect(downloads).not_to_contain_text("so far")
    expect(downloads.locator("a[data-kind='output']")).to_have_attribute("data-file-id", ended["output_file_id"])
    expect(downloads.locator("a[data-kind='errors']")).to_have_attribute("data-file-id", ended["error_file_id"])
    expect(page.locator("form.cancel")).to_have_count(0)
    expect(page.locator("form.retry")).to_have_count(1)
    expect(live.locator("li[data-step='cancelled']")).to_have_class("done")
    assert page.evaluate("window.__sameDocument") is True  # all of it swapped in place, no reload


def test_the_record_browser_says_what_each_answer_was_and_money_keeps_its_digits(server, page: Page):
    chat_id = create(server, [chat("c", "hello there")])["id"]
    embed_id = create(server, [embed("e", "x", model="test/embed")], endpoint=EMBEDDINGS)["id"]
    assert server.wait(chat_id)["status"] == "completed"
    embedded = server.wait(embed_id)
    assert embedded["usage"]["cost_nano_usd"] == 10  # one token at $0.02/Mtok, half price: $0.00000001
    sign_in(page, server, server.api_key)

    page.goto(dashboard_root(server) + f"/batches/{chat_id}")
    record = page.locator("#records li[data-custom-id='c']")
    record.locator("summary").click()
    expect(record.locator(".answer-text")).to_have_text("echo: hello there")
    expect(record.locator(".answer-text + pre.json")).to_have_count(1)  # above the raw line

    page.goto(dashboard_root(server) + f"/batches/{embed_id}")
    record = page.locator("#records li[data-custom-id='e']")
    record.locator("summary").click()
    expect(record.locator(".answer-text")).to_have_text("embedding of 8 floats")  # the test engine's size
    expect(page.locator("#batch-live [data-cost]")).to_have_text("$0.00000001")

    page.goto(dashboard_root(server) + "/")
    expect(page.locator(f"tr[data-batch-id='{embed_id}'] [data-cost]")).to_have_text("$0.00000001")
