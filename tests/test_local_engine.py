"""The built-in catalog's local chat model end to end: real batches through SmolLM2 on the CPU, on chat completions
and on text completions."""

from __future__ import annotations

import orjson
import pytest
from openai.types import Completion

from tests.test_builtin_models import run_batch

pytestmark = pytest.mark.slow  # the built-in SmolLM2 through llama.cpp

COMPLETIONS = "/v1/completions"


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


def test_builtin_chat_model_serves_text_completions_through_the_sdk(make_server):
    server = make_server(catalog="builtin")
    client = server.client()

    def record(custom_id: str, **body: object) -> dict[str, object]:
        return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS,
                "body": {"model": "openrelay/smollm2-135m", **body}}

    batch, out, err = run_batch(client, [
        record("france", prompt="The capital of France is", max_tokens=8, temperature=0),
        record("no-prompt", max_tokens=8),
        record("two-prompts", prompt=["a", "b"]),
        record("no-tokens", prompt="Hi", max_tokens=-1),  # the same check as chat's
        record("zero-tokens", prompt="Hi", max_tokens=0),
    ], COMPLETIONS)
    assert batch.status == "completed", server.log()[-2000:]
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 1, "failed": 4}
    completion = Completion.model_validate(out["france"]["response"]["body"])
    assert completion.object == "text_completion" and completion.model == "openrelay/smollm2-135m"
    assert completion.id.startswith("cmpl-") and completion.choices[0].text.strip()
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 8
    assert batch.usage.input_tokens == completion.usage.prompt_tokens
    assert batch.usage.model_dump()["cost_nano_usd"] == (completion.usage.prompt_tokens * 10
                                                         + completion.usage.completion_tokens * 20)
    assert {custom_id: line["error"]["status_code"] for custom_id, line in err.items()} == {
        "no-prompt": 400, "two-prompts": 400, "no-tokens": 400, "zero-tokens": 400}
    assert "prompt" in err["no-prompt"]["error"]["message"]
    assert "max_tokens must be a positive integer" in err["no-tokens"]["error"]["message"]
