"""Cached and reasoning tokens on the bill: the engine's usage details roll up into the batch's ``usage`` in the
shape of the OpenAI SDK's ``BatchUsage`` (zeros where none are reported), cached input tokens are billed at the
model's ``cached_input_usd_per_mtok``, and the progress object carries the adaptive ``concurrency_limit``."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.leases import BatchLeases
from openrelay.store.results import Chunk, Results
from openrelay.types import Batch, BatchStatus
from openrelay.worker.usage import RecordUsage, record_usage
from tests.conftest import BACKEND, Servers
from tests.support.batches import batch_usage, chat, create, get, results, wait_for
from tests.support.server import Server, create_pg_database, drop_pg_database

SERVER_PER_MODULE = True  # the module's own server (below), a fresh organization per test

MODEL = "test/cached"
# Per token at the standard tier (x 0.5): input 150 nano-USD, cached input 37.5, output 600.
CATALOG = """
[pricing]
standard = 0.5
expedited = 0.75

[[models]]
name = "test/cached"
endpoints = ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"]
slots = 2
concurrency = 8
input_usd_per_mtok = 0.30
cached_input_usd_per_mtok = 0.075
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "echo-served", timeout_seconds = 30 }}
"""


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Server]:
    """Overrides conftest's: one server for the module, on a catalog with a cached input rate."""
    servers = Servers(tmp_path_factory, engine_url)
    yield servers.make(catalog=CATALOG.format(engine=engine_url))
    servers.stop_all()


def _raw(server: Server, method: str, path: str, **kwargs) -> dict:
    answer = server.http(method, path, **kwargs)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _assert_sdk_reads(batch: dict) -> None:
    """The official SDK's models parse the raw batch object, its usage details included."""
    usage = openai.types.BatchUsage.model_validate(batch["usage"])
    assert usage.input_tokens_details.cached_tokens == batch["usage"]["input_tokens_details"]["cached_tokens"]
    assert usage.output_tokens_details.reasoning_tokens == batch["usage"]["output_tokens_details"][
        "reasoning_tokens"]
    parsed = openai.types.Batch.model_validate(batch)
    assert parsed.usage == usage and parsed.model == MODEL


# -- reading one answer's usage -----------------------------------------------------------------------------------

def test_record_usage_reads_each_endpoints_details():
    chat_body = {"usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                           "prompt_tokens_details": {"cached_tokens": 6},
                           "completion_tokens_details": {"reasoning_tokens": 3}}}
    assert record_usage("/v1/chat/completions", chat_body) == RecordUsage(
        input_tokens=10, cached_tokens=6, output_tokens=4, reasoning_tokens=3)
    assert record_usage("/v1/completions", chat_body) == record_usage("/v1/chat/completions", chat_body)
    responses_body = {"usage": {"input_tokens": 9, "output_tokens": 5, "total_tokens": 14,
                                "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                                "output_tokens_details": {"reasoning_tokens": 1}}}
    assert record_usage("/v1/responses", responses_body) == RecordUsage(
        input_tokens=9, cached_tokens=2, output_tokens=5, reasoning_tokens=1)
    # Chat's names mean nothing to a Responses answer, and embeddings have no details whatever they say.
    assert record_usage("/v1/responses", chat_body) == RecordUsage()
    embedding = {"usage": {"prompt_tokens": 7, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 7}}}
    assert record_usage("/v1/embeddings", embedding) == RecordUsage(input_tokens=7)
    # A detail beyond its total counts as the total; what is not a non-negative integer counts 0.
    assert record_usage("/v1/chat/completions", {"usage": {
        "prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 50},
        "completion_tokens_details": {"reasoning_tokens": 9}}}) == RecordUsage(
        input_tokens=3, cached_tokens=3, output_tokens=2, reasoning_tokens=2)
    for odd in (None, -4, 2.5, "6", True, [6]):
        assert record_usage("/v1/chat/completions", {"usage": {
            "prompt_tokens": 5, "completion_tokens": odd, "prompt_tokens_details": {"cached_tokens": odd},
            "completion_tokens_details": odd}}) == RecordUsage(input_tokens=5)
    assert record_usage("/v1/chat/completions", {"usage": {"prompt_tokens": 5, "prompt_tokens_details": 3}}) \
        == RecordUsage(input_tokens=5)
    assert record_usage("/v1/chat/completions", {"usage": "lots"}) == RecordUsage()
    assert record_usage("/v1/chat/completions", {}) == RecordUsage()


# -- the store: chunks carry the details, the batch sums them; the concurrency limit is fenced --------------------

@pytest.fixture
def store(tmp_path) -> Iterator[Database]:
    url = create_pg_database() if BACKEND == "postgres" else f"sqlite:///{tmp_path / 'cached.db'}"
    db = Database(url)
    try:
        db.migrate()
        with db.write() as conn:
            conn.exec_driver_sql("INSERT INTO organizations (id, name, expedited_enabled, created_at) "
                                 "VALUES ('o1', 'o1', true, 0)")
            conn.exec_driver_sql("INSERT INTO api_keys (id, org_id, key_hash, prefix, scopes, spent_nano_usd, "
                                 "created_at) VALUES ('k1', 'o1', 'h', 'p', 'batch.read', 0, 0)")
        yield db
    finally:
        db.dispose()
        if BACKEND == "postgres":
            drop_pg_database(url)


def test_chunks_store_the_details_and_the_batch_sums_them(store: Database):
    rows, results = Batches(store), Results(store)
    rows.create(Batch(id="batch_c1", org_id="o1", key_id="k1", endpoint="/v1/chat/completions",
                      input_file_id="file_1", input_blob_key="blob_1", completion_window="24h",
                      priority="standard", status=BatchStatus.VALIDATING, model="m", created_at=0,
                      expires_at=4_000_000_000, total=3), created_ns=1, new_files=[])
    assert rows.get("o1", "batch_c1").as_api()["usage"] == batch_usage()
    assert BatchLeases(store).claim("w1", {"m": 1}, 60.0) is not None
    first = Chunk(seq=1, out_key="o/1", err_key=None, lines=[1, 2], completed=2, failed=0, input_tokens=30,
                  cached_tokens=20, output_tokens=8, reasoning_tokens=5, cost_nano_usd=900)
    second = Chunk(seq=2, out_key="o/2", err_key=None, lines=[3], completed=1, failed=0, input_tokens=4,
                   output_tokens=2, cost_nano_usd=100)  # an answer with no details
    for chunk in (first, second, second):  # the repeated commit adds nothing
        results.commit_chunk("batch_c1", "w1", "k1", chunk)
    assert results.chunks("batch_c1") == [first, second]
    batch = BatchLeases(store).by_id("batch_c1")
    assert (batch.cached_tokens, batch.reasoning_tokens) == (20, 5)
    assert rows.get("o1", "batch_c1").as_api()["usage"] == batch_usage(34, 10, 1000, cached_tokens=20,
                                                                       reasoning_tokens=5)


def test_the_concurrency_limit_is_written_only_under_the_lease(store: Database):
    Batches(store).create(Batch(id="batch_l1", org_id="o1", key_id="k1", endpoint="/v1/chat/completions",
                      input_file_id="file_1", input_blob_key="blob_1", completion_window="24h",
                      priority="standard", status=BatchStatus.VALIDATING, model="m", created_at=0,
                      expires_at=4_000_000_000, total=3), created_ns=1, new_files=[])
    rows = BatchLeases(store)
    assert rows.by_id("batch_l1").concurrency_limit is None
    assert rows.claim("w1", {"m": 1}, 60.0) is not None
    rows.set_concurrency_limit("batch_l1", "w1", 12)
    rows.set_concurrency_limit("batch_l1", "w1", 12)  # unchanged: no row written, no error
    assert rows.by_id("batch_l1").concurrency_limit == 12
    rows.set_concurrency_limit("batch_l1", "w2", 3)  # not the lease holder: nothing, and no error
    assert rows.by_id("batch_l1").concurrency_limit == 12
    rows.set_concurrency_limit("batch_l1", "w1", 16)
    assert rows.by_id("batch_l1").concurrency_limit == 16
    rows.release("batch_l1", "w1")
    rows.set_concurrency_limit("batch_l1", "w1", 2)  # the lease is gone
    assert rows.by_id("batch_l1").concurrency_limit == 16


# -- through `orl serve` and the official SDK ---------------------------------------------------------------------

def test_a_batch_bills_cached_tokens_and_shows_the_details_in_openais_shape(server: Server):
    # The test engine counts a chat prompt's words (directives included); #tokens= sets the completion.
    records = [
        chat("a", "alpha beta gamma delta #cached_tokens=3 #reasoning_tokens=2 #tokens=5", MODEL),  # 7 in
        chat("b", "one two three four five six #cached_tokens=6 #tokens=4", MODEL),  # 8 in
        chat("c", "plain words here #reasoning_tokens=3 #tokens=3", MODEL),  # 5 in
    ]
    created = create(server, records)
    _assert_sdk_reads(created)
    assert created["openrelay"]["concurrency_limit"] is None
    done = server.wait(created["id"])
    assert done["status"] == "completed", done
    out, _err = results(server, done)
    reported = [out[i]["response"]["body"]["usage"] for i in "abc"]
    assert [u["prompt_tokens"] for u in reported] == [7, 8, 5]
    assert sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in reported) == 3 + 6
    assert sum(u.get("completion_tokens_details", {}).get("reasoning_tokens", 0) for u in reported) == 2 + 3
    # By hand, record by record, rounded half to even: a: 4 x 150 + 3 x 37.5 + 5 x 600 = 3712.5 -> 3712;
    # b: 2 x 150 + 6 x 37.5 + 4 x 600 = 2925; c: 5 x 150 + 3 x 600 = 2550.
    assert done["usage"] == batch_usage(20, 12, 3712 + 2925 + 2550, cached_tokens=9, reasoning_tokens=5)
    assert done["openrelay"]["concurrency_limit"] is None  # no limit in force once the batch has ended

    _assert_sdk_reads(done)
    page = _raw(server, "GET", "/batches", params={"limit": 10})
    (row,) = [b for b in page["data"] if b["id"] == done["id"]]
    assert row["usage"] == done["usage"] and row["openrelay"]["concurrency_limit"] is None
    for listed in page["data"]:
        _assert_sdk_reads(listed)
    sdk = server.client().batches.retrieve(done["id"])
    assert sdk.usage is not None and sdk.usage.input_tokens_details.cached_tokens == 9
    assert sdk.usage.output_tokens_details.reasoning_tokens == 5 and sdk.usage.total_tokens == 32
    assert sdk.model_extra["openrelay"]["concurrency_limit"] is None


def test_a_responses_batch_reads_input_and_output_tokens_details(server: Server):
    record = {"custom_id": "r", "method": "POST", "url": "/v1/responses",
              "body": {"model": MODEL, "input": "alpha beta #cached_tokens=2 #reasoning_tokens=1 #tokens=3"}}
    done = server.wait(create(server, [record], endpoint="/v1/responses")["id"])
    assert done["status"] == "completed", done
    # 5 input tokens (the directives are words too), 2 of them cached; 3 output: 3 x 150 + 2 x 37.5 + 3 x 600.
    assert done["usage"] == batch_usage(5, 3, 2325, cached_tokens=2, reasoning_tokens=1)
    _assert_sdk_reads(done)


def test_batches_without_details_report_zeros(server: Server):
    plain = create(server, [chat("p", "no details here #tokens=2", MODEL)])
    embeddings = create(server, [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                                  "body": {"model": MODEL, "input": "three words here"}}], endpoint="/v1/embeddings")
    dry = _raw(server, "POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                 "dry_run": True, "requests": [chat("d", "priced only", MODEL)]})
    for answer in (plain, embeddings, dry):
        assert answer["usage"] == batch_usage(), answer
        assert answer["openrelay"]["concurrency_limit"] is None
        openai.types.BatchUsage.model_validate(answer["usage"])
    assert server.wait(plain["id"])["usage"] == batch_usage(4, 2, 4 * 150 + 2 * 600)
    assert server.wait(embeddings["id"])["usage"] == batch_usage(3, 0, 3 * 150)


def test_the_progress_object_shows_the_limit_its_worker_wrote(make_server, engine_url: str):
    # This test is the worker (as tests/test_chunk_fencing.py is): no run of the server's own writes a limit.
    server = make_server(catalog=CATALOG.format(engine=engine_url), args=("--no-worker",))
    batch_id = create(server, [chat("q", "never sent", MODEL)])["id"]
    db = Database(server.database_url)
    try:
        rows = BatchLeases(db)
        assert rows.claim("test-worker", {MODEL: 1}, 60.0) is not None
        assert get(server, batch_id)["openrelay"]["concurrency_limit"] is None  # running; nothing written yet
        for limit in (5, 6):  # each change is seen, by a batch's poll and by a page
            rows.set_concurrency_limit(batch_id, "test-worker", limit)
            wait_for(lambda limit=limit: get(server, batch_id)["openrelay"]["concurrency_limit"] == limit,
                     f"the batch to show {limit}")
            # A poll's answer is reused for a quarter of a second (api/poll_cache.py).
            wait_for(lambda limit=limit: _raw(server, "GET", "/batches")["data"][0]["openrelay"][
                "concurrency_limit"] == limit, f"the page to show {limit}")
        _assert_sdk_reads(get(server, batch_id))
    finally:
        db.dispose()
