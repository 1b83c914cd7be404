"""The built-in catalog's local chat model, once end to end: a real batch through SmolLM2 on the CPU."""

from __future__ import annotations

import orjson
import pytest

pytestmark = pytest.mark.slow  # the built-in SmolLM2 through llama.cpp


def test_builtin_catalog_runs_a_real_batch_through_smollm2(make_server):
    server = make_server(catalog="builtin")
    client = server.client()
    assert "openrelay/smollm2-135m" in [m.id for m in client.models.list()]
    question = {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
    # Inline requests: the SDK's create() insists on input_file_id, so this one goes over plain HTTP.
    created = server.http("POST", "/batches", json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "requests": [
            {"custom_id": "france", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "openrelay/smollm2-135m", "messages": [question], "max_tokens": 32,
                      "temperature": 0}},
            {"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "openrelay/smollm2-135m", "messages": "not a list"}},
        ]})
    assert created.status_code == 200, created.text
    done = server.wait(created.json()["id"], timeout=300)
    assert done["status"] == "completed", server.log()[-2000:]
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    line = orjson.loads(client.files.content(done["output_file_id"]).content)
    body = line["response"]["body"]
    assert body["model"] == "openrelay/smollm2-135m"
    assert "paris" in body["choices"][0]["message"]["content"].lower()
    usage = body["usage"]
    assert usage["prompt_tokens"] > 10 and 0 < usage["completion_tokens"] <= 32
    assert done["usage"]["input_tokens"] == usage["prompt_tokens"]
    assert done["usage"]["output_tokens"] == usage["completion_tokens"]
    # 0.02 and 0.04 USD per Mtok at the standard factor 0.5: 10 and 20 nano-USD per token.
    assert done["usage"]["cost_nano_usd"] == usage["prompt_tokens"] * 10 + usage["completion_tokens"] * 20
    error = orjson.loads(client.files.content(done["error_file_id"]).content)
    assert error["custom_id"] == "bad" and error["error"]["status_code"] == 400
