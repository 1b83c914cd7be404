"""Issue 22 parts 1, 2 and 6 on the New batch and Files pages, in a real browser against a real `orl serve`: the
form takes the endpoint from the uploaded records and offers only endpoints a model serves; the file picker and
the Files page show when each file came and the batches made from it; an estimate with no rejection says so."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.batches import CHAT, EMBEDDINGS, batch_ids, chat, embed, jsonl, post_batch, upload
from tests.support.browser import dashboard_root, sign_in

pytestmark = pytest.mark.slow  # Chromium

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)
SERVED = [CHAT, EMBEDDINGS, "/v1/completions", "/v1/messages"]  # what the test catalog's serve: no /v1/responses


def _upload_in_form(page: Page, server, path: Path) -> str:
    """Upload ``path`` with the New batch form; the id of the file the form then names."""
    page.goto(dashboard_root(server) + "/new")
    page.set_input_files("input[type=file]", str(path))
    page.click("#upload-form button")
    expect(page).to_have_url(re.compile(r"input_file_id=file-"))
    return page.url.rsplit("input_file_id=", 1)[1]


def _iso(stamp: int) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat()


def test_the_form_takes_the_endpoint_from_the_records_and_offers_only_served_ones(server, page: Page, tmp_path):
    endpoint = page.locator("select[name=endpoint]")
    sign_in(page, server, server.api_key)
    page.goto(dashboard_root(server) + "/new")
    assert endpoint.locator("option").evaluate_all("options => options.map(o => o.value)") == SERVED

    embeddings = tmp_path / "embeddings.jsonl"
    embeddings.write_bytes(jsonl(embed("e1", "one"), embed("e2", "two")))
    embeddings_id = _upload_in_form(page, server, embeddings)
    expect(endpoint).to_have_value(EMBEDDINGS)
    expect(page.locator("[data-guess=chosen]")).to_contain_text(EMBEDDINGS)
    page.click("#create-form button.primary")
    expect(page).to_have_url(re.compile(r"/batches/batch_[0-9a-f]{12}\?created=1$"))
    made = server.wait(page.locator("#batch-id").inner_text())
    assert made["endpoint"] == EMBEDDINGS and made["request_counts"] == {"total": 2, "completed": 2, "failed": 0}

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(jsonl(chat("c1"), embed("e3"), chat("c2")))
    _upload_in_form(page, server, mixed)
    expect(endpoint).to_have_value("")  # several: nothing chosen, and the form asks for a choice
    several = page.locator("[data-guess=several]")
    expect(several).to_contain_text(CHAT)
    expect(several).to_contain_text(EMBEDDINGS)
    page.click("#create-form button.primary")
    expect(page.locator("#create-form select[name=endpoint]:invalid")).to_have_count(1)  # the browser held it
    assert len(batch_ids(server)) == 1

    unserved = tmp_path / "responses.jsonl"
    unserved.write_bytes(jsonl({"custom_id": "r", "method": "POST", "url": "/v1/responses",
                                "body": {"model": "test/echo", "input": "hi"}}))
    _upload_in_form(page, server, unserved)
    expect(page.locator("[data-guess=unserved]")).to_contain_text("/v1/responses")
    expect(endpoint).to_have_value("")

    # Picking another file in the picker draws its endpoint again, in place.
    page.evaluate("window.__sameDocument = true")
    page.select_option("select[name=input_file_id]", embeddings_id)
    expect(endpoint).to_have_value(EMBEDDINGS)
    expect(page.locator("[data-guess=unserved]")).to_have_count(0)
    assert page.evaluate("window.__sameDocument") is True


def test_the_files_page_and_the_picker_show_when_each_file_came_and_the_batches_it_fed(server, page: Page):
    used = upload(server, jsonl(chat("a")))
    unused = upload(server, jsonl(chat("b")))
    first, second = (post_batch(server, input_file_id=used).json()["id"] for _ in range(2))
    created_at = server.http("GET", f"/files/{used}").json()["created_at"]
    sign_in(page, server, server.api_key)

    page.goto(dashboard_root(server) + "/files")
    row = page.locator(f"tr[data-file-id='{used}']")
    expect(row.locator("time")).to_have_attribute("datetime", _iso(created_at))
    links = row.locator("td.uses a[data-batch-id]")
    expect(links).to_have_count(2)
    assert links.evaluate_all("links => links.map(a => a.dataset.batchId)") == [second, first]  # newest first
    expect(page.locator(f"tr[data-file-id='{unused}'] td.uses")).to_have_text("no batch yet")
    links.first.click()
    expect(page.locator("#batch-id")).to_have_text(second)

    page.goto(dashboard_root(server) + "/new")
    option = page.locator(f"select[name=input_file_id] option[value='{used}']")
    expect(option).to_contain_text(re.compile(r"uploaded (just now|[0-9hms ]+ ago)"))
    expect(option).to_contain_text("used by 2 batches")
    expect(page.locator(f"select[name=input_file_id] option[value='{unused}']")).to_contain_text("no batch yet")
    page.select_option("select[name=input_file_id]", used)
    picked = page.locator(f".picked-file[data-file-id='{used}']")
    expect(picked.locator("time")).to_have_attribute("datetime", _iso(created_at))
    expect(picked.locator("a[data-batch-id]")).to_have_count(2)
    picked.locator(f"a[data-batch-id='{first}']").click()
    expect(page.locator("#batch-id")).to_have_text(first)


def test_an_estimate_with_no_rejection_says_so_and_prices_in_significant_digits(server, page: Page, tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_bytes(jsonl(embed("t1", "x", model="test/embed")))  # one token at 10 nano-USD
    sign_in(page, server, server.api_key)
    _upload_in_form(page, server, path)
    page.click("#create-form button[name=dry_run]")
    estimate = page.locator("#estimate")
    expect(estimate).to_be_visible()
    expect(estimate.locator("table.rejections")).to_have_count(0)
    expect(estimate.locator("[data-rejections=none]")).to_have_text("No record was rejected.")
    expect(estimate.locator("[data-estimate=cost]")).to_have_text(re.compile(r"^\$0\.0*[1-9]\d{0,2} to \$0\.0*[1-9]"))
    assert batch_ids(server) == []
