"""``"dry_run": true`` on a create (issue 14 part 5): every check, the answer the create would give with
``"id": null``, ``"dry_run": true`` and ``openrelay.estimate``; nothing created, stored or billed, no
Idempotency-Key claimed. Through the API, the official SDK and ``orl batches create --dry-run``; the counts exact
against the real usage of the built-in models, approximate (by the documented rule) on a remote engine."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import Servers
from tests.support.batches import chat

SERVER_PER_MODULE = True

STANDARD_IN, STANDARD_OUT = 150, 600  # test/echo at 0.30 / 1.20 USD per Mtok, x 0.5: nano-USD per token
HELLO_TOKENS = 3 + 4 + 3  # "hello world": 11 bytes / 4 rounded up, + 4 for its message, + 3 for the reply


def _bound(record: dict) -> int:
    """A record's most input tokens on a remote engine: a token per byte of its body, + 256 for a chat template."""
    return len(orjson.dumps(record["body"])) + 256


def _with(record: dict, **body) -> dict:
    return {**record, "body": {**record["body"], **body}}


def _nothing_stored(server) -> None:
    assert server.http("GET", "/batches").json()["data"] == []
    assert server.http("GET", "/files").json()["data"] == []


def test_dry_run_answers_what_the_create_would_and_stores_nothing(server):
    records = [_with(chat("r1", "hello world"), max_tokens=50), chat("r2", "hello world"),
               _with(chat("r3", "hello world"), stream=True)]
    answer = server.http("POST", "/batches", headers={"Idempotency-Key": "k-dry"}, json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": records, "dry_run": True,
        "metadata": {"job": "estimate"}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"] is None and body["dry_run"] is True and body["object"] == "batch"
    assert body["status"] == "validating" and body["model"] == "test/echo"
    assert body["input_file_id"] is None  # inline: no file is stored
    assert body["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
    assert body["rejected_count"] == 1 and body["rejected_records_file_id"] is None
    assert [(r["line"], r["code"]) for r in body["rejected_records"]] == [(3, "streaming_unsupported")]
    assert body["metadata"] == {"job": "estimate"}
    assert body["openrelay"]["queue_position"] is None
    most_in = _bound(records[0]) + _bound(records[1])
    assert body["openrelay"]["estimate"] == {
        "input_tokens": 2 * HELLO_TOKENS,
        "max_input_tokens": most_in,
        "max_output_tokens": 50 + 4096,  # r2 names no max_tokens: the catalog default
        "min_cost_nano_usd": 2 * HELLO_TOKENS * STANDARD_IN,
        "max_cost_nano_usd": most_in * STANDARD_IN + (50 + 4096) * STANDARD_OUT,
        "tokens_counted": "approximate",  # test/echo is a remote engine
        "reusable_prefix_tokens": 0, "reusable_prefix_counted": "approximate",  # prompts too short to share
    }
    _nothing_stored(server)
    # The key was not claimed: a real create with it and another body is not idempotency_key_reused.
    real = server.http("POST", "/batches", headers={"Idempotency-Key": "k-dry"}, json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": records[:1]})
    assert real.status_code == 200, real.text
    assert real.json()["id"].startswith("batch_") and "dry_run" not in real.json()


def test_dry_run_at_the_expedited_rate_and_from_a_file_through_the_sdk(server):
    client = server.client()
    records = [_with(chat(f"r{i}", "hello world"), max_completion_tokens=10) for i in range(3)]
    data = b"".join(orjson.dumps(record) + b"\n" for record in records)
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", extra_body={"dry_run": True, "priority": "expedited"})
    assert batch.id is None and batch.input_file_id == uploaded.id and batch.priority == "expedited"
    assert batch.model_extra["dry_run"] is True and batch.request_counts.total == 3
    estimate = batch.model_extra["openrelay"]["estimate"]
    assert estimate["input_tokens"] == 3 * HELLO_TOKENS and estimate["max_output_tokens"] == 30
    assert estimate["min_cost_nano_usd"] == 3 * HELLO_TOKENS * 225  # 0.30 x 1,000 x 0.75
    assert estimate["max_input_tokens"] == 3 * _bound(records[0])
    assert estimate["max_cost_nano_usd"] == 3 * _bound(records[0]) * 225 + 30 * 900
    assert client.batches.list().data == []
    assert [f.id for f in client.files.list().data] == [uploaded.id]  # only the upload itself


def test_dry_run_refusals_are_the_creates(server):
    bad = [_with(chat("r1", "x"), stream=True)]
    answer = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                   "requests": bad, "dry_run": True})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "no_valid_records" and error["rejected_count"] == 1
    assert error["rejected_records_file_id"] is None  # a dry run stores no rejections file
    _nothing_stored(server)
    wrong = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                  "requests": [chat("r1", "x")], "dry_run": "yes"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "dry_run"
    no = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                               "requests": [chat("r1", "x")], "dry_run": False})
    assert no.status_code == 200 and no.json()["id"].startswith("batch_")  # false: an ordinary create


def test_dry_run_with_a_used_up_budget_is_refused_like_a_create(server):
    broke = server.new_org_key(None, "--budget-usd", "0")
    answer = server.http("POST", "/batches", api_key=broke, json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": [chat("r1", "x")],
        "dry_run": True})
    assert answer.status_code == 402 and answer.json()["error"]["code"] == "key_budget_exceeded"


def test_orl_batches_create_dry_run_leaves_nothing(server, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps(_with(chat(f"r{i}", "hello world"), max_tokens=5)) + b"\n"
                                for i in range(4)) + b"\n{not json\n")
    done = server.orl("batches", "create", "--input-file", str(source), "--dry-run")
    assert done.returncode == 0, done.stderr
    answer = orjson.loads(done.stdout)
    assert answer["id"] is None and answer["dry_run"] is True and answer["rejected_count"] == 1
    assert answer["openrelay"]["estimate"]["input_tokens"] == 4 * HELLO_TOKENS
    assert "dry run, nothing created: 4 records would run on test/echo" in done.stderr
    assert "line 6" in done.stderr  # the rejection preview, counted in the file's lines
    _nothing_stored(server)  # the CLI deleted the upload it made for the dry run


# -- exact counts: the built-in catalog's local engines, against what the real run bills -----------------------

@pytest.fixture(scope="module")
def builtin(tmp_path_factory, engine_url):
    servers = Servers(tmp_path_factory, engine_url)
    server = servers.make(catalog="builtin")
    server.api_key = server.new_org_key()
    yield server
    servers.stop_all()


def _dry_then_real(server, endpoint: str, records: list[dict]) -> tuple[dict, dict]:
    body = {"endpoint": endpoint, "completion_window": "24h", "requests": records}
    dry = server.http("POST", "/batches", json={**body, "dry_run": True})
    assert dry.status_code == 200, dry.text
    real = server.http("POST", "/batches", json=body)
    assert real.status_code == 200, real.text
    return dry.json()["openrelay"]["estimate"], server.wait(real.json()["id"], timeout=300)


@pytest.mark.slow
def test_llama_cpp_counts_are_exact(builtin):
    model = "openrelay/smollm2-135m"
    records = [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "Name a colour."}]}},
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "max_tokens": 2, "messages": [
             {"role": "system", "content": "You answer in one word."},
             {"role": "user", "content": "Ünïcode, émojis 🎉 and a longer question about the sea?"}]}},
    ]
    estimate, done = _dry_then_real(builtin, "/v1/chat/completions", records)
    assert done["status"] == "completed", done
    assert estimate["tokens_counted"] == "exact"
    assert estimate["input_tokens"] == done["usage"]["input_tokens"]
    assert estimate["max_output_tokens"] == 5 and done["usage"]["output_tokens"] <= 5
    assert estimate["min_cost_nano_usd"] <= done["usage"]["cost_nano_usd"] <= estimate["max_cost_nano_usd"]


@pytest.mark.slow
def test_embeddings_counts_are_exact_with_no_output(builtin):
    records = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                "body": {"model": "openrelay/minilm-l6", "input": text}}
               for i, text in enumerate(["short", ["two texts", "the second, a little longer " * 40]])]
    estimate, done = _dry_then_real(builtin, "/v1/embeddings", records)
    assert done["status"] == "completed", done
    assert estimate["tokens_counted"] == "exact" and estimate["max_output_tokens"] == 0
    assert estimate["input_tokens"] == done["usage"]["input_tokens"]
    assert estimate["min_cost_nano_usd"] == estimate["max_cost_nano_usd"] == done["usage"]["cost_nano_usd"]


@pytest.mark.slow
def test_ocr_counts_by_the_engines_rule(builtin):
    png = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
           "AAAABJRU5ErkJggg==")  # one pixel
    text = "Read this receipt, please."
    record = {"custom_id": "o", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "openrelay/rapidocr", "messages": [{"role": "user", "content": [
                  {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": png}}]}]}}
    answer = builtin.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                    "requests": [record], "dry_run": True})
    assert answer.status_code == 200, answer.text
    estimate = answer.json()["openrelay"]["estimate"]
    assert estimate["tokens_counted"] == "exact"
    assert estimate["input_tokens"] == 85 + -(-len(text) // 4)


# -- the output limit, as a function -----------------------------------------------------------------------------

def test_output_limit_comes_from_the_record_else_the_models_default():
    from openrelay.catalog import parse_catalog
    from openrelay.engines.worst_case import DEFAULT_MAX_TOKENS, output_limit
    from openrelay.errors import CatalogError

    catalog = parse_catalog('''
[[models]]
name = "remote"
endpoints = ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"]
default_max_tokens = 2048
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }

[[models]]
name = "plain"
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }

[[models]]
name = "local"
engine = { kind = "llama-cpp", gguf = "x.gguf", max_tokens = 300 }
''')
    remote, plain, local = (catalog.models[n] for n in ("remote", "plain", "local"))
    chat = "/v1/chat/completions"
    assert output_limit(chat, {"max_completion_tokens": 7, "max_tokens": 9}, remote) == 7
    assert output_limit(chat, {"max_tokens": 9}, remote) == 9
    assert output_limit(chat, {}, remote) == 2048
    assert output_limit(chat, {"max_tokens": 0}, remote) == 2048  # not a limit the engine would honor
    assert output_limit("/v1/responses", {"max_output_tokens": 5, "max_tokens": 9}, remote) == 5
    assert output_limit("/v1/embeddings", {"max_tokens": 9}, remote) == 0
    assert output_limit(chat, {}, plain) == DEFAULT_MAX_TOKENS
    assert output_limit(chat, {}, local) == 300  # the llama-cpp engine's own default
    with pytest.raises(CatalogError, match="default_max_tokens"):
        parse_catalog('[[models]]\nname = "m"\ndefault_max_tokens = 0\nengine = { kind = "openai" }\n')


def test_the_dashboards_new_page_estimates_without_creating(server):
    import re

    import httpx

    data = b"".join(orjson.dumps(_with(chat(f"r{i}", "hello world"), max_tokens=5)) + b"\n" for i in range(2))
    uploaded = server.http("POST", "/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}).json()
    client = httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=30)
    try:
        client.get("/login")
        client.post("/login", data={"csrf": client.cookies["orl_login"], "api_key": server.api_key})
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/new").text).group(1)
        page = client.post("/new", data={"csrf": csrf, "input_file_id": uploaded["id"],
                                         "endpoint": "/v1/chat/completions", "priority": "standard",
                                         "dry_run": "1"})
    finally:
        client.close()
    assert page.status_code == 200, page.text
    assert "Estimate · nothing was created" in page.text
    assert f'data-estimate="input_tokens">{2 * HELLO_TOKENS} (approximate)' in page.text
    assert 'data-estimate="max_output_tokens">10<' in page.text
    assert server.http("GET", "/batches").json()["data"] == []
