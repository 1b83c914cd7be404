"""Issue 22 on the dashboard over plain HTTP against a real `orl serve` (no browser needed): the create answers a
303 to the new batch's page, so a reload reads it and creates nothing; the favicon every page links is served
(no 404); the batches made from a page's files are one indexed query; money reads in significant digits."""

from __future__ import annotations

import re

import sqlalchemy as sa

from openrelay.config import Settings
from openrelay.money import usd_text
from openrelay.runtime import open_runtime
from openrelay.service import records
from openrelay.store.files import Files
from tests.conftest import BACKEND
from tests.support.batches import CHAT, batch_ids, chat, create, get, jsonl, post_batch, upload, wait_for
from tests.support.browser import signed_in_client

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def test_a_create_answers_a_303_to_the_batch_page_and_reading_it_again_creates_nothing(server):
    file_id = upload(server, jsonl(chat("a"), chat("b", model="test/unknown")))
    with signed_in_client(server) as (client, csrf):
        form = {"csrf": csrf, "input_file_id": file_id, "endpoint": CHAT, "priority": "standard",
                "idempotency_key": "k-303"}
        created = client.post("/new", data=form)
        assert created.status_code == 303, created.text[:500]
        (batch_id,) = batch_ids(server)
        assert created.headers["location"] == f"/batches/{batch_id}?created=1"
        for _ in range(2):  # what a reload of the page the browser landed on sends
            shown = client.get(created.headers["location"])
            assert shown.status_code == 200
            assert 'id="created"' in shown.text and 'data-line="1"' not in shown.text
            assert 'data-line="2"' in shown.text and "model_not_offered" in shown.text
        assert batch_ids(server) == [batch_id]
        estimate = client.post("/new", data={**form, "dry_run": "1", "idempotency_key": "k-dry"})
        assert estimate.status_code == 200 and 'id="estimate"' in estimate.text  # a dry run stays on the form
        assert batch_ids(server) == [batch_id]


def test_the_favicon_every_page_links_is_served_and_favicon_ico_finds_it(server):
    with signed_in_client(server) as (client, _csrf):
        links = set()
        for path in ("/login", "/", "/new", "/files"):
            page = client.get(path)
            assert page.status_code == 200, path
            links |= set(re.findall(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)"', page.text))
        (icon,) = links
        got = client.get(icon)
        assert got.status_code == 200 and got.headers["content-type"] == "image/svg+xml"
        assert got.content.startswith(b"<svg")
        legacy = client.get("/favicon.ico")
        assert legacy.status_code == 301 and legacy.headers["location"] == icon


def test_the_batches_of_a_page_of_files_are_one_query_on_the_input_file_index(server):
    files = [upload(server, jsonl(chat(f"r{i}"))) for i in range(4)]
    made = {}
    for file_id, times in zip(files, (3, 1, 0, 2), strict=True):
        made[file_id] = [post_batch(server, input_file_id=file_id).json()["id"] for _ in range(times)]
    org_id = server.store_accounts().org_by_name(server.org).id
    db = server.accounts[0]  # the server's store, opened in this process
    statements: list[tuple[str, object]] = []

    def seen(_conn, _cursor, statement, parameters, *_args) -> None:
        statements.append((statement, parameters))

    sa.event.listen(db.engine, "before_cursor_execute", seen)
    try:
        found = Files(db).batches_reading(org_id, files, newest=2)
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", seen)
    queries = [(s, p) for s, p in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(queries) == 1, statements
    assert set(found) == {f for f in files if made[f]}  # a file no batch used is left out
    for file_id, ids in made.items():
        if ids:
            assert found[file_id].count == len(ids)
            assert list(found[file_id].batch_ids) == ids[::-1][:2]  # the newest first, at most two
    (query, parameters), = queries
    with db.read() as conn:
        if BACKEND == "postgres":
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # a few rows: the planner would read them all
            plan = " ".join(str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + query, parameters))
        else:
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + query, parameters))
    assert "ix_batches_org_input_file" in plan, plan


def test_money_reads_in_significant_digits_from_the_integer():
    assert [usd_text(n) for n in (0, 1, 10, 1200, 1350, 12_345_678, 123_456_789, 999_499_999)] == [
        "$0", "$0.000000001", "$0.00000001", "$0.0000012", "$0.00000135", "$0.0123", "$0.123", "$0.999"]
    assert [usd_text(n) for n in (999_500_000, 5_000_000_000, 1_234_567_890_000)] == ["$1.00", "$5.00", "$1,234.57"]


def test_the_record_browser_reads_the_composed_files_of_a_batch_that_ended_while_it_read(server, engine):
    """A batch page read a running batch's chunks; when the batch ended meanwhile, they were composed into its
    result files and deleted: the browser reads those files instead of failing (a 500 on the page before)."""
    batch_id = create(server, [chat("bad", "refused #status=400"), chat("held", "slow #hold=browse-end")])["id"]
    engine.wait_held("browse-end")
    wait_for(lambda: server.http("GET", f"/files/file-{batch_id}-error").json()["openrelay"]["lines"] == 1,
             "the refused record's line in a chunk")
    rt = open_runtime(Settings.build(data_dir=server.data_dir, database_url=server.database_url,
                                     catalog_path=server.data_dir / "catalog.toml"))
    try:
        key = rt.accounts.authenticate(server.api_key)
        running = rt.batches.get(key.org_id, batch_id)  # as the page read it, before the end
        assert not running.terminal and running.rejected_count == 0
        engine.release("browse-end")
        wait_for(lambda: get(server, batch_id)["status"] == "completed", "the batch to end")
        assert records.error_summary(rt, key, running) == [("invalid_request_error", 1)]
        page = records.browse_records(rt, key, batch_id)
        assert sorted(r.custom_id for r in page.records) == ["bad", "held"]
    finally:
        rt.close()
