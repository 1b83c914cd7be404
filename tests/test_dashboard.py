"""The dashboard in a real browser (Chromium through Playwright) against a real `orl serve` and the test engine:
sign-in, the Batch page (tag chips, filters, live progress), the detail page (cancel, metadata, downloads), the
new-batch form, and the safety rules (organizations, scopes, CSRF, untrusted text). One browser and one server
for the module; each test is a fresh organization."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.browser import csrf_of, dashboard_root, sign_in

pytestmark = pytest.mark.slow  # Chromium

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)
XSS_TAG = "<script>window.__pwned='tag'</script>"
XSS_VALUE = '"><img src=x onerror="window.__pwned=\'value\'">'


def _request(custom_id: str, text: str = "hello", model: str = "test/echo") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def _create(server, records: list[dict], metadata: dict | None = None, api_key: str | None = None,
            endpoint: str = "/v1/chat/completions") -> dict:
    body: dict = {"endpoint": endpoint, "completion_window": "24h", "requests": records}
    if metadata:
        body["metadata"] = metadata
    resp = server.http("POST", "/batches", json=body, api_key=api_key)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _row(page: Page, batch_id: str):
    return page.locator(f"tr[data-batch-id='{batch_id}']")


def test_sign_in_with_a_good_and_a_bad_key_and_sign_out(server, page: Page, context: BrowserContext):
    root = dashboard_root(server)
    page.goto(root + "/")
    expect(page).to_have_url(re.compile(r"/login"))
    page.fill("input[name=api_key]", "orl-not-a-key")
    page.click("button[type=submit]")
    expect(page.locator(".problem")).to_contain_text("Incorrect API key")
    expect(page).to_have_url(re.compile(r"/login"))
    assert not [c for c in context.cookies() if c["name"] == "orl_session"]

    sign_in(page, server, server.api_key)
    expect(page.locator("h1")).to_have_text("Batches")
    cookie = next(c for c in context.cookies() if c["name"] == "orl_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]  # served over http
    response = page.request.get(root + "/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp

    page.click("form.logout button")
    expect(page).to_have_url(re.compile(r"/login"))
    # The session ended on the server: the old cookie opens nothing.
    context.add_cookies([{**cookie}])
    page.goto(root + "/")
    expect(page).to_have_url(re.compile(r"/login"))


def test_api_batches_show_tag_chips_in_one_colour_everywhere_and_filters_narrow_rows(server, engine, page: Page):
    nightly = _create(server, [_request("a")], {"tags": "nightly,customer-42", "job": "summaries"})
    evals = _create(server, [_request("b")], {"tags": "eval"})
    embed = _create(server, [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                              "body": {"model": "test/embed", "input": "x"}}], {"tags": "nightly"},
                    endpoint="/v1/embeddings")
    for batch in (nightly, evals, embed):
        server.wait(batch["id"])
    sign_in(page, server, server.api_key)
    for batch in (nightly, evals, embed):
        expect(_row(page, batch["id"])).to_have_count(1)
    chip = _row(page, nightly["id"]).locator("[data-tag='nightly']")
    colour = chip.get_attribute("class")
    assert re.fullmatch(r"chip chip-\d+", colour or "")
    assert _row(page, embed["id"]).locator("[data-tag='nightly']").get_attribute("class") == colour
    expect(_row(page, nightly["id"]).locator("[data-tag]")).to_have_count(2)
    expect(page.locator(".summary [data-count-status='completed']")).to_contain_text("3")

    chip.click()  # a chip filters by its tag
    expect(page).to_have_url(re.compile(r"[?&]tag=nightly"))
    expect(page.locator("tr[data-batch-id]")).to_have_count(2)
    expect(_row(page, evals["id"])).to_have_count(0)

    page.goto(dashboard_root(server) + "/?tag=nightly&model=test%2Fembed")
    expect(page.locator("tr[data-batch-id]")).to_have_count(1)
    expect(_row(page, embed["id"])).to_have_count(1)
    page.goto(dashboard_root(server) + "/")
    page.select_option("select[name=status]", "running")
    page.click(".filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"[?&]status=running"))
    expect(page.locator(".empty")).to_contain_text("No batch matches")
    page.goto(dashboard_root(server) + "/?status=completed&tag=eval")
    expect(page.locator("tr[data-batch-id]")).to_have_count(1)

    page.goto(dashboard_root(server) + f"/batches/{nightly['id']}")
    assert page.locator("#metadata [data-tag='nightly']").get_attribute("class") == colour
    assert page.locator(".sub [data-tag='nightly']").get_attribute("class") == colour


def test_running_batch_advances_without_reload_and_stops_polling_at_its_end(server, engine, page: Page):
    gate = f"live-{time.monotonic_ns()}"
    batch = _create(server, [_request(f"r{i}", f"#hold={gate}") for i in range(4)], {"tags": "live"})
    engine.wait_held(gate, 4)
    sign_in(page, server, server.api_key)
    row = _row(page, batch["id"])
    expect(row).to_have_attribute("data-status", "running")
    page.evaluate("window.__sameDocument = true")
    engine.release(gate, count=2)
    expect(row.locator(".progress")).to_have_attribute("data-completed", "2")
    engine.release(gate)
    expect(row).to_have_attribute("data-status", "completed")
    assert page.evaluate("window.__sameDocument") is True  # no reload: the rows were swapped in place
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "fragment=rows" in r.url else None)
    page.wait_for_timeout(2500)  # more than two poll periods: a live page would have asked twice
    assert polls == []
    expect(page.locator("#live-rows")).not_to_have_attribute("hx-get", re.compile(".*"))


def test_cancel_metadata_edit_and_downloads_equal_the_apis_bytes(server, engine, page: Page):
    gate = f"cancel-{time.monotonic_ns()}"
    held = _create(server, [_request(f"h{i}", f"#hold={gate}") for i in range(3)])
    engine.wait_held(gate, 1)
    done = _create(server, [_request("ok"), _request("bad", "#status=400")], {"tags": "keep"})
    server.wait(done["id"])
    sign_in(page, server, server.api_key)

    page.goto(dashboard_root(server) + f"/batches/{held['id']}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form.cancel button")
    engine.release(gate)
    ended = server.wait(held["id"])
    assert ended["status"] == "cancelled"
    page.goto(dashboard_root(server) + f"/batches/{held['id']}")
    expect(page.locator("form.cancel")).to_have_count(0)

    page.goto(dashboard_root(server) + f"/batches/{done['id']}")
    page.fill("input[name=add_tags]", "reviewed, q4")
    page.locator("input[name=meta_key]").last.fill("owner")
    page.locator("input[name=meta_value]").last.fill("ana")
    page.click(".metadata-editor button.primary")
    expect(page.locator("#metadata [data-tag='q4']")).to_have_count(1)
    assert server.http("GET", f"/batches/{done['id']}").json()["metadata"] == {"tags": "keep,reviewed,q4",
                                                                              "owner": "ana"}
    page.click("#metadata button[name=remove_tag][value=keep]")
    expect(page.locator("#metadata [data-tag='keep']")).to_have_count(0)
    assert server.http("GET", f"/batches/{done['id']}").json()["metadata"]["tags"] == "reviewed,q4"

    expect(page.locator("#error-summary [data-error-code]")).to_have_count(1)
    links = page.locator("#downloads a[data-file-id]")
    file_ids = [links.nth(i).get_attribute("data-file-id") for i in range(links.count())]
    final = server.http("GET", f"/batches/{done['id']}").json()
    assert set(file_ids) == {final["input_file_id"], final["output_file_id"], final["error_file_id"]}
    for file_id in file_ids:
        got = page.request.get(dashboard_root(server) + f"/files/{file_id}/content")
        assert got.status == 200
        assert got.body() == server.http("GET", f"/files/{file_id}/content").content

    page.goto(dashboard_root(server) + f"/batches/{done['id']}?kind=error")
    expect(page.locator("#records li[data-custom-id]")).to_have_count(1)
    expect(page.locator("#records li[data-custom-id='bad']")).to_have_count(1)


def test_upload_and_create_show_rejections_with_their_line_numbers(server, page: Page, tmp_path):
    good = '{"custom_id": "ok-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "test/echo", ' \
           '"messages": [{"role": "user", "content": "hi"}]}}'
    path = tmp_path / "mixed.jsonl"
    path.write_text(good + "\n{not json\n\n" + good.replace("test/echo", "test/unknown").replace("ok-1", "x") + "\n")
    sign_in(page, server, server.api_key)
    page.goto(dashboard_root(server) + "/new")
    page.set_input_files("input[type=file]", str(path))
    page.click("#upload-form button")
    expect(page).to_have_url(re.compile(r"input_file_id=file-"))
    page.fill("input[name=tags]", "from-ui")
    page.click("#create-form button.primary")
    expect(page).to_have_url(re.compile(r"/batches/batch_[0-9a-f]{12}\?created=1$"))  # the create's 303
    page.reload()  # reads the batch again: no second create
    created = page.locator("#created")
    expect(created).to_be_visible()
    expect(created.locator("tr[data-line]")).to_have_count(2)
    expect(created.locator("tr[data-line='2']")).to_contain_text("invalid_json")
    expect(created.locator("tr[data-line='4']")).to_contain_text("model_not_offered")
    batch_id = created.get_attribute("data-batch-id")
    batch = server.http("GET", f"/batches/{batch_id}").json()
    assert batch["metadata"] == {"tags": "from-ui"} and batch["request_counts"]["total"] == 3
    assert len(server.http("GET", "/batches").json()["data"]) == 1

    path.write_text("{not json\n" + good.replace("test/echo", "test/unknown") + "\n")
    page.goto(dashboard_root(server) + "/new")
    page.set_input_files("input[type=file]", str(path))
    page.click("#upload-form button")
    page.click("#create-form button.primary")
    refused = page.locator("#refused")
    expect(refused).to_contain_text("No batch was created")
    expect(refused.locator("tr[data-line='1']")).to_contain_text("invalid_json")
    expect(refused.locator("tr[data-line='2']")).to_contain_text("model_not_offered")
    assert len(server.http("GET", "/batches").json()["data"]) == 1


def test_organizations_scopes_and_csrf_rule_the_pages(server, engine, page: Page, context: BrowserContext):
    root = dashboard_root(server)
    other_key = server.new_org_key()
    theirs = _create(server, [_request("t")], api_key=other_key)
    gate = f"scope-{time.monotonic_ns()}"
    ours = _create(server, [_request("o", f"#hold={gate}")])
    engine.wait_held(gate, 1)
    sign_in(page, server, server.api_key)

    unknown = page.goto(root + "/batches/batch_000000000000")
    other = page.goto(root + f"/batches/{theirs['id']}")
    assert unknown.status == other.status == 404
    page.goto(root + f"/batches/{theirs['id']}")
    other_text = page.locator("main").inner_text()
    page.goto(root + "/batches/batch_000000000000")
    assert page.locator("main").inner_text() == other_text
    assert page.request.get(root + f"/files/{theirs['input_file_id']}/content").status == 404

    # A POST without the session's CSRF token changes nothing.
    refused = page.request.post(root + f"/batches/{ours['id']}/cancel", form={"x": "1"})
    assert refused.status == 403
    assert server.http("GET", f"/batches/{ours['id']}").json()["status"] == "in_progress"

    # A key without batch.write sees no cancel or edit control, and its forged POST (with a good token) is refused.
    page.click("form.logout button")
    context.clear_cookies()
    accounts = server.store_accounts()
    org_id = accounts.org_by_name(server.org).id
    _key, read_only = accounts.create_key(org_id, scopes=("batch.read", "files.read"))
    sign_in(page, server, read_only)
    page.goto(root + f"/batches/{ours['id']}")
    expect(page.locator("#batch-live")).to_be_visible()
    expect(page.locator("form.cancel")).to_have_count(0)
    expect(page.locator("form.metadata-editor")).to_have_count(0)
    forged = page.request.post(root + f"/batches/{ours['id']}/cancel", form={"csrf": csrf_of(page)})
    assert forged.status == 403
    assert server.http("GET", f"/batches/{ours['id']}").json()["status"] == "in_progress"
    engine.release(gate)


def test_untrusted_text_renders_as_text_and_runs_nothing(server, page: Page):
    batch = _create(server, [_request(XSS_TAG), _request(XSS_VALUE)],
                    {"tags": f"{XSS_TAG},{XSS_VALUE}", XSS_VALUE: XSS_TAG, "note": XSS_VALUE})
    server.wait(batch["id"])
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(page, server, server.api_key)
    row = _row(page, batch["id"])
    expect(row.locator("[data-tag]")).to_have_count(2)
    assert row.locator("[data-tag]").nth(0).inner_text() == XSS_TAG
    assert row.locator("[data-tag]").nth(1).get_attribute("data-tag") == XSS_VALUE
    assert page.locator("img[src=x]").count() == 0
    page.goto(dashboard_root(server) + f"/batches/{batch['id']}")
    items = page.locator("#records li[data-custom-id]")
    expect(items).to_have_count(2)
    assert {items.nth(i).get_attribute("data-custom-id") for i in range(2)} == {XSS_TAG, XSS_VALUE}
    assert set(page.locator("#records code.cid").all_inner_texts()) == {XSS_TAG, XSS_VALUE}
    assert page.locator("#metadata [data-tag]").nth(0).get_attribute("data-tag") == XSS_TAG
    values = page.locator("#metadata input[name=meta_value]")
    assert XSS_VALUE in [values.nth(i).input_value() for i in range(values.count())]
    assert page.locator("img[src=x]").count() == 0 and page.locator("main script").count() == 0
    assert page.evaluate("window.__pwned") is None and dialogs == []
