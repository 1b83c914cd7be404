"""The `openai` engine kind against a real OpenAI-compatible server: llama-cpp-python's `llama_cpp.server` on
SmolLM2, behind an API key, with a chat batch and a `/v1/completions` batch through `orl serve`."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support.batches import batch_usage
from tests.support.llama_server import start_llama_server, stop_llama_server
from tests.support.server import Server, free_port

pytestmark = pytest.mark.slow  # llama_cpp.server on SmolLM2

MODEL = "test/smollm2-remote"
KEY_ENV = "ORL_TEST_LLAMA_SERVER_KEY"
CATALOG = """
[[models]]
name = "{model}"
endpoints = ["/v1/chat/completions", "/v1/completions"]
slots = 1
concurrency = 2
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
[models.engine]
kind = "openai"
base_url = "{url}"
served_model = "smollm2"
api_key_env = "{key_env}"
timeout_seconds = 120
legacy_max_tokens = true
"""


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, API key) of one `python -m llama_cpp.server` for this module."""
    key = secrets.token_hex(12)
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    proc, url = start_llama_server(free_port(), log, api_key=key)
    try:
        yield url, key
    finally:
        stop_llama_server(proc)


@pytest.fixture
def remote_server(make_server, llama_server) -> Server:
    url, key = llama_server
    return make_server(catalog=CATALOG.format(model=MODEL, url=url, key_env=KEY_ENV), env={KEY_ENV: key})


def record(custom_id: str, url: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, "temperature": 0, **body}}


def result_lines(server: Server, file_id: str) -> dict[str, dict]:
    content = server.client().files.content(file_id).content
    return {line["custom_id"]: line for line in map(orjson.loads, content.splitlines())}


def assert_usage_billed(batch: dict, lines: dict[str, dict]) -> None:
    """Every line has real usage; the batch's usage is their sum, at 0.30/1.20 USD per Mtok x 0.5 (standard)."""
    usages = [line["response"]["body"]["usage"] for line in lines.values()]
    for usage in usages:
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    # llama-server reports the prompt tokens its cache served (the catalog has no cached rate: they cost the same)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    reasoning = sum((u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0) for u in usages)
    assert batch["usage"] == batch_usage(prompt, completion, prompt * 150 + completion * 600, cached_tokens=cached,
                                         reasoning_tokens=reasoning)


def test_chat_batch_through_llama_cpp_server(remote_server: Server, tmp_path: Path):
    france = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    requests = [
        record("france", "/v1/chat/completions", messages=france, max_tokens=12),
        # Only max_completion_tokens: llama_cpp.server ignores it, legacy_max_tokens sends it as max_tokens.
        record("story", "/v1/chat/completions", messages=story, max_completion_tokens=5),
    ]
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    client = remote_server.client()
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = remote_server.wait(batch.id, timeout=240)
    assert done["status"] == "completed", remote_server.log()[-3000:]
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert done["error_file_id"] is None
    lines = result_lines(remote_server, done["output_file_id"])
    for line in lines.values():
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["model"] == MODEL
        assert line["response"]["body"]["object"] == "chat.completion"
    answer = lines["france"]["response"]["body"]["choices"][0]["message"]["content"]
    assert "paris" in answer.lower()
    story_body = lines["story"]["response"]["body"]
    assert story_body["usage"]["completion_tokens"] == 5
    assert story_body["choices"][0]["finish_reason"] == "length"
    assert_usage_billed(done, lines)


def test_completions_batch_through_llama_cpp_server(remote_server: Server, tmp_path: Path):
    requests = [
        record("paris", "/v1/completions", prompt="The capital of France is the city of", max_tokens=4),
        record("count", "/v1/completions", prompt="One, two, three, four,", max_tokens=4),
    ]
    path = tmp_path / "completions.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    created = remote_server.orl("batches", "create", "--input-file", str(path), "--endpoint", "/v1/completions")
    assert created.returncode == 0, created.stderr
    batch = orjson.loads(created.stdout)
    assert batch["endpoint"] == "/v1/completions" and batch["model"] == MODEL
    waited = remote_server.orl("batches", "wait", batch["id"])
    assert waited.returncode == 0, waited.stderr
    done = orjson.loads(waited.stdout)
    assert done["status"] == "completed", remote_server.log()[-3000:]
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    lines = result_lines(remote_server, done["output_file_id"])
    for line in lines.values():
        assert line["response"]["body"]["model"] == MODEL
        assert line["response"]["body"]["object"] == "text_completion"
    assert "paris" in lines["paris"]["response"]["body"]["choices"][0]["text"].lower()
    assert "five" in lines["count"]["response"]["body"]["choices"][0]["text"].lower()
    assert_usage_billed(done, lines)


def test_without_the_key_each_record_carries_the_engines_401(make_server, llama_server):
    url, _ = llama_server
    server = make_server(catalog=CATALOG.format(model=MODEL, url=url, key_env=KEY_ENV), env={KEY_ENV: ""})
    created = server.http("POST", "/batches", json={
        "endpoint": "/v1/completions", "completion_window": "24h",
        "requests": [record("a", "/v1/completions", prompt="Hello", max_tokens=2)]})
    assert created.status_code == 200, created.text
    done = server.wait(created.json()["id"])
    assert done["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    line = result_lines(server, done["error_file_id"])["a"]
    assert line["response"] is None and line["error"]["status_code"] == 401
    assert done["usage"]["cost_nano_usd"] == 0
