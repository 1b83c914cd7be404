"""The built-in chat model (``openrelay/smollm2-135m``) on ``/v1/responses``: a real batch through SmolLM2 on the
CPU driven by the official SDK, its answers parsed by the SDK's own ``Response`` model, and the fields it cannot
honour refused per record. Kept small: two records reach the model, with a few output tokens each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from openai.types.responses import Response

from openrelay.catalog import load_catalog
from openrelay.engines.responses_local import ChatRequest, chat_request
from openrelay.validation.scan import file_lines, scan_records
from tests.test_builtin_models import run_batch

MODEL = "openrelay/smollm2-135m"
RESPONSES = "/v1/responses"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "responses.jsonl"


def read(body: dict[str, Any]) -> ChatRequest | str:
    return chat_request({"model": MODEL, **body}, default_max_tokens=256, model_name=MODEL)


def test_a_responses_request_read_as_a_chat():
    plain = read({"input": "Hi"})
    assert plain == ChatRequest(messages=[{"role": "user", "content": "Hi"}], max_output_tokens=256,
                                temperature=1.0, top_p=1.0, instructions=None, metadata={})
    full = read({"instructions": "Be brief.", "max_output_tokens": 8, "temperature": 0, "top_p": 0.5,
                 "metadata": {"k": "v"}, "store": False, "user": "u-1", "tool_choice": "none", "tools": [],
                 "text": {"format": {"type": "text"}}, "input": [
                     {"role": "developer", "content": "No jokes."},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi "},
                                                                     {"type": "input_text", "text": "there"}]},
                     {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
                     {"role": "user", "content": "Bye"}]})
    assert isinstance(full, ChatRequest)
    assert full.messages == [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "No jokes."},
                             {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello."},
                             {"role": "user", "content": "Bye"}]
    assert (full.max_output_tokens, full.temperature, full.top_p, full.metadata) == (8, 0.0, 0.5, {"k": "v"})


def test_the_example_file_passes_create_and_reads_as_chats():
    """examples/responses.jsonl (docs/builtin-models.md) is accepted by the built-in catalog, every record of it."""
    scanned = scan_records(lambda: file_lines(EXAMPLES.open("rb"), 1 << 20), endpoint=RESPONSES,
                           catalog=load_catalog(None), max_records=100)
    assert (scanned.total, scanned.rejections, scanned.model) == (3, [], MODEL)
    for raw in EXAMPLES.read_bytes().splitlines():
        assert isinstance(read(orjson.loads(raw)["body"]), ChatRequest)


@pytest.mark.parametrize(("body", "message"), [
    ({"tools": [{"type": "function", "name": "f"}]}, "tools: openrelay/smollm2-135m does not support tool calling"),
    ({"tool_choice": "required"}, "tool_choice: openrelay/smollm2-135m does not support tool calling"),
    ({"reasoning": {"effort": "low"}}, "reasoning: openrelay/smollm2-135m does not support reasoning"),
    ({"previous_response_id": "resp_1"}, "previous_response_id: openrelay/smollm2-135m does not support earlier"),
    ({"background": True}, "background: openrelay/smollm2-135m does not support background responses"),
    ({"store": True}, "store: openrelay/smollm2-135m does not support storing responses"),
    ({"text": {"format": {"type": "json_object"}}}, "text: openrelay/smollm2-135m does not support output formats"),
    ({"frobnicate": 1}, "frobnicate: unknown parameter for /v1/responses on openrelay/smollm2-135m"),
    ({"input": None}, "input: field required"),
    ({"input": []}, "input: field required"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]},
     "input[0].content: part 0 is of type 'input_image'; this model reads only input_text parts"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
     "input[0]: items of type 'function_call_output' are not supported"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role: must be one of user, system, developer"),
    ({"max_output_tokens": 0}, "max_output_tokens: must be a positive integer"),
    ({"temperature": 3}, "temperature: must be a number from 0 to 2"),
    ({"top_p": "high"}, "top_p: must be a number from 0 to 1"),
    ({"instructions": ["x"]}, "instructions: must be a string"),
])
def test_what_the_local_model_cannot_honour_is_refused(body, message):
    problem = read({"input": "Hi", **body})
    assert isinstance(problem, str) and problem.startswith(message), problem


@pytest.mark.slow
def test_builtin_model_answers_a_responses_batch_through_the_sdk(make_server):
    server = make_server(catalog="builtin")
    client = server.client()
    offered = {m.id: m.model_extra["endpoints"] for m in client.models.list().data}
    assert offered[MODEL] == ["/v1/chat/completions", "/v1/completions", RESPONSES, "/v1/messages"]

    def record(custom_id: str, **body: Any) -> dict[str, Any]:
        return {"custom_id": custom_id, "method": "POST", "url": RESPONSES, "body": {"model": MODEL, **body}}

    records = [
        record("france", input="What is the capital of France? Answer in one sentence.", max_output_tokens=24,
               temperature=0),
        record("cut", instructions="You are a helpful assistant.", max_output_tokens=3, temperature=0,
               input=[{"role": "user", "content": [{"type": "input_text", "text": "Count from one to ten."}]}]),
        record("tools", input="Hi", tools=[{"type": "function", "name": "f", "parameters": {}}]),
        record("reasoning", input="Hi", reasoning={"effort": "high"}),
        record("previous", input="Hi", previous_response_id="resp_123"),
        record("image", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]),
        record("streamed", input="Hi", stream=True),
    ]
    batch, out_lines, err_lines = run_batch(client, records, RESPONSES)
    assert batch.status == "completed", server.log()[-3000:]
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 5)
    lines = [*out_lines.values(), *err_lines.values()]
    assert len(lines) == 7 and all((line["response"] is None) != (line["error"] is None) for line in lines)
    out = {custom_id: Response.model_validate(line["response"]["body"]) for custom_id, line in out_lines.items()}
    err = {custom_id: line["error"] for custom_id, line in err_lines.items()}

    france = out["france"]
    assert france.object == "response" and france.model == MODEL and france.id.startswith("resp_")
    assert "paris" in france.output_text.lower()
    [message] = france.output
    assert message.type == "message" and message.role == "assistant"
    assert [part.type for part in message.content] == ["output_text"]
    assert france.usage is not None and france.usage.input_tokens > 10 and 0 < france.usage.output_tokens <= 24
    assert france.usage.total_tokens == france.usage.input_tokens + france.usage.output_tokens
    assert (france.temperature, france.max_output_tokens) == (0.0, 24)

    cut = out["cut"]
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 3
    assert cut.instructions == "You are a helpful assistant."

    # Billed from input_tokens and output_tokens: 0.02 and 0.04 USD per Mtok at the standard factor 0.5.
    usages = [r.usage for r in out.values() if r.usage is not None]
    assert batch.usage.input_tokens == sum(u.input_tokens for u in usages)
    assert batch.usage.output_tokens == sum(u.output_tokens for u in usages)
    assert batch.usage.model_extra["cost_nano_usd"] == batch.usage.input_tokens * 10 + batch.usage.output_tokens * 20

    for custom_id, start in (("tools", "tools: "), ("reasoning", "reasoning: "), ("previous", "previous_response_id: "),
                             ("image", "input[0].content: ")):
        assert err[custom_id]["status_code"] == 400 and err[custom_id]["message"].startswith(start), err[custom_id]
    assert err["streamed"] == {"code": "streaming_unsupported",
                               "message": 'line 7: "stream": true is not supported in batch'}
