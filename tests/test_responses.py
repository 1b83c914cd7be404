"""Batches on the Responses API (``/v1/responses``) on an ``openai`` engine (the test engine): the official SDK
from upload to results parsed by its own ``Response`` model, the create rules, billing from ``input_tokens`` /
``output_tokens``, and tool calling over a real MCP server. The built-in model's side is test_responses_local.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from openai.types.responses import Response

from tests.support import http_client
from tests.support.batches import cost, create, results, usage_of
from tests.support.mcp_server import running_mcp_server
from tests.support.polling import until_terminal
from tests.support.server import ECHO_ENDPOINTS, catalog_text

RESPONSES = "/v1/responses"


def catalog(engine_url: str, *allow: str) -> str:
    """The test catalog with ``test/echo`` offering /v1/responses too, and its tool servers allowed."""
    return catalog_text(engine_url, endpoints=(*ECHO_ENDPOINTS, RESPONSES), tools=allow)


def record(custom_id: str, model: str = "test/echo", url: str = RESPONSES, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": model, **body}}


def run_with_sdk(client: openai.OpenAI, records: list[dict[str, Any]]) -> tuple[Any, dict, dict, list[dict]]:
    """Upload, create, poll to the end with the SDK; (batch, output lines, error lines, every line)."""
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=RESPONSES, completion_window="24h")
    assert batch.endpoint == RESPONSES and batch.status == "validating"
    batch = until_terminal(lambda: client.batches.retrieve(batch.id), f"batch {batch.id}")
    lines = [orjson.loads(raw) for file_id in (batch.output_file_id, batch.error_file_id) if file_id
             for raw in client.files.content(file_id).content.splitlines()]
    out = {line["custom_id"]: line for line in lines if line["response"] is not None}
    err = {line["custom_id"]: line for line in lines if line["error"] is not None}
    return batch, out, err, lines


def sent(engine, marker: str) -> list[dict[str, Any]]:
    """The engine's /v1/responses requests whose input text carries ``marker``, in order."""
    return [r["body"] for r in engine.requests() if r["path"] == RESPONSES and marker in orjson.dumps(
        r["body"]["input"]).decode()]


def test_sdk_runs_a_responses_batch_and_parses_its_results(make_server, engine, engine_url):
    server = make_server(catalog=catalog(engine_url))
    client = server.client()
    assert RESPONSES in next(m for m in client.models.list().data if m.id == "test/echo").model_extra["endpoints"]
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer in English."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "name a colour"}]},
    ]
    records = [
        record("text", input="hello responses", max_output_tokens=40, temperature=0, metadata={"k": "v"}),
        record("conversation", input=conversation, instructions="You are a test."),
        record("refused", input="fail me #status=400"),
        record("streamed", input="hi", stream=True),
        record("chat-url", url="/v1/chat/completions", messages=[{"role": "user", "content": "hi"}]),
        record("embed-model", model="test/embed", input="hi"),
        record("tokens", input="count me #tokens=7"),
    ]
    batch, out, err, lines = run_with_sdk(client, records)
    assert batch.status == "completed", server.log()[-3000:]
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 3, 4)
    for line in lines:  # exactly one of response and error on every line
        assert set(line) == {"id", "custom_id", "response", "error"}
        assert (line["response"] is None) != (line["error"] is None)
        assert line["id"] == f"batch_req_{line['custom_id']}"

    parsed = {cid: Response.model_validate(line["response"]["body"]) for cid, line in out.items()}
    assert sorted(parsed) == ["conversation", "text", "tokens"]
    text = parsed["text"]
    assert text.object == "response" and text.status == "completed"
    assert text.model == "test/echo"  # the catalog name, not the engine's
    assert text.output_text == "echo: hello responses"
    assert text.usage is not None and (text.usage.input_tokens, text.usage.output_tokens) == (2, 3)
    assert parsed["conversation"].output_text == "echo: name a colour"
    assert parsed["tokens"].usage is not None and parsed["tokens"].usage.output_tokens == 7

    # The engine got the records' bodies as written, at its own /v1/responses, under its own model name.
    [text_sent] = sent(engine, "hello responses")
    assert text_sent == {"model": "echo-served", "input": "hello responses", "max_output_tokens": 40,
                         "temperature": 0, "metadata": {"k": "v"}}
    [conversation_sent] = sent(engine, "name a colour")
    assert conversation_sent["input"] == conversation and conversation_sent["instructions"] == "You are a test."
    assert {r["path"] for r in engine.requests()} == {RESPONSES}

    # Billing: input_tokens x input rate + output_tokens x output rate, summed into the batch's usage.
    usage = server.http("GET", f"/batches/{batch.id}").json()["usage"]
    assert usage == usage_of(out)
    assert usage["cost_nano_usd"] == sum(cost(r.usage.input_tokens, r.usage.output_tokens)
                                         for r in parsed.values() if r.usage is not None)
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == 3 + 4 + 7

    # A run-time 4xx is the engine's error line; create rejections are "line N:" lines with no status_code.
    assert err["refused"]["error"]["status_code"] == 400
    assert err["refused"]["error"]["message"] == "test engine told to fail with 400"
    assert err["streamed"]["error"] == {"code": "streaming_unsupported",
                                        "message": 'line 4: "stream": true is not supported in batch'}
    assert err["chat-url"]["error"] == {
        "code": "url_mismatch",
        "message": 'line 5: url "/v1/chat/completions" does not match the batch endpoint "/v1/responses"'}
    assert err["embed-model"]["error"] == {
        "code": "model_endpoint_mismatch",
        "message": 'line 6: model "test/embed" is not offered for /v1/responses (it serves: /v1/embeddings)'}


def test_create_rules_on_responses(make_server, engine, engine_url):
    server = make_server(catalog=catalog(engine_url))
    answer = server.http("POST", "/batches", json={"endpoint": RESPONSES, "completion_window": "24h", "requests": [
        record("a", input="hi"),
        record("a", input="again"),
        record("ext", input="hi", openrelay={"workflow_id": 1}),
        {"custom_id": "no-model", "method": "POST", "url": RESPONSES, "body": {"input": "hi"}},
        record("unknown", model="openrelay/unknown", input="hi"),
        record("moved", input="hi", tool_config={}),
        record("ok", input="fine"),
    ]})
    assert answer.status_code == 200, answer.text
    created = answer.json()
    assert created["endpoint"] == RESPONSES and created["model"] == "test/echo" and created["rejected_count"] == 6
    assert created["request_counts"] == {"total": 7, "completed": 0, "failed": 6}
    assert [(r["line"], r["code"]) for r in created["rejected_records"]] == [
        (1, "duplicate_custom_id"), (2, "duplicate_custom_id"), (3, "unknown_extension"), (4, "missing_model"),
        (5, "model_not_offered"), (6, "tool_config_moved")]
    # A model that does not offer /v1/responses, and an endpoint the catalog does not know.
    refused = server.http("POST", "/batches", json={"endpoint": RESPONSES, "completion_window": "24h",
                                                     "requests": [record("e", model="test/embed", input="x")]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "no_valid_records"
    bad = server.http("POST", "/batches", json={"endpoint": "/v1/responses/", "completion_window": "24h",
                                                "requests": [record("e", input="x")]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "endpoint"
    assert bad.json()["error"]["message"] == ("endpoint must be one of: /v1/chat/completions, /v1/embeddings, "
                                              "/v1/completions, /v1/responses, /v1/messages")


# -- tool calling over MCP ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_root() -> Iterator[str]:
    with running_mcp_server() as root:
        yield root


def tool_record(custom_id: str, text: str, mcp_url: str, tools: list[Any] | None = None,
                **config: Any) -> dict[str, Any]:
    body = {"tools": tools} if tools is not None else {}
    return record(custom_id, input=text, openrelay={"tool_config": {"servers": [{"url": mcp_url}], **config}},
                  **body)


def test_tool_calling_over_mcp_on_responses_records(make_server, engine, engine_url, mcp_root):
    mcp_url = mcp_root + "/mcp"
    http_client.post(mcp_root + "/calls/reset", timeout=10).raise_for_status()
    server = make_server(catalog=catalog(engine_url, mcp_url))
    own_tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    created = create(server, [
        tool_record("one-round", 'add please #call_tool=add:{"a":2,"b":3} #tokens=5', mcp_url),
        tool_record("three-rounds", 'echo thrice #call_tool=echo:{"text":"ping"} #tool_rounds=3', mcp_url,
                    max_rounds=3),
        tool_record("at-once", "just answer", mcp_url),
        record("without", input="just answer"),
        tool_record("own-tool", "mine #call_tool=lookup:{}", mcp_url, tools=[own_tool]),
        tool_record("forever", 'loop #call_tool=echo:{"text":"again"} #tool_rounds=100', mcp_url, max_rounds=2),
    ], endpoint=RESPONSES)
    assert created["rejected_count"] == 0
    batch = server.wait(created["id"])
    assert batch["request_counts"] == {"total": 6, "completed": 5, "failed": 1}, server.log()[-3000:]
    out, err = results(server, batch)

    one = out["one-round"]["response"]["body"]
    assert one["openrelay"] == {"tool_rounds": 1} and one["model"] == "test/echo"
    assert Response.model_validate(one).output_text == "tool results: sum=5"
    turns = sent(engine, "add please")
    assert len(turns) == 2
    # Usage is summed over the turns: each turn's input and output tokens, details too.
    assert one["usage"]["output_tokens"] == 5 + 5
    assert one["usage"]["input_tokens"] == 2 * len("add please #call_tool=add:{\"a\":2,\"b\":3} #tokens=5".split()) + 1
    assert one["usage"]["total_tokens"] == one["usage"]["input_tokens"] + one["usage"]["output_tokens"]
    assert one["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}

    # Every call: tool_config stripped, the server's tools offered as flat Responses function tools; the second
    # turn carries the model's function_call and the tool's function_call_output, joined by call_id.
    for body in turns:
        assert "openrelay" not in body and body["model"] == "echo-served"
    add_tool = next(t for t in turns[0]["tools"] if t["name"] == "add")
    assert add_tool["type"] == "function" and add_tool["description"] == "Add two integers."
    assert add_tool["parameters"]["properties"].keys() == {"a", "b"}
    assert turns[0]["input"] == 'add please #call_tool=add:{"a":2,"b":3} #tokens=5'
    user, call, result = turns[1]["input"]
    assert user == {"role": "user", "content": turns[0]["input"]}
    assert call["type"] == "function_call" and (call["name"], call["arguments"]) == ("add", '{"a":2,"b":3}')
    assert result == {"type": "function_call_output", "call_id": call["call_id"], "output": "sum=5"}

    three = out["three-rounds"]["response"]["body"]
    assert three["openrelay"] == {"tool_rounds": 3}
    assert Response.model_validate(three).output_text == "tool results: ping | ping | ping"
    assert len(sent(engine, "echo thrice")) == 4

    # Answered at once: the line is the one it would be without tool_config (ids and times aside).
    at_once, without = (dict(out[k]["response"]["body"]) for k in ("at-once", "without"))
    for body in (at_once, without):  # the engine's own per-request values
        del body["id"], body["created_at"]
        for item in body["output"]:
            del item["id"]
    assert "openrelay" not in at_once
    at_once.pop("tools"), without.pop("tools")  # the engine echoes the tools it was offered
    assert orjson.dumps(at_once) == orjson.dumps(without)

    # A call of the record's own tool ends the loop: the answer goes back as it is, function_call and all, and
    # the record's own tool is offered first.
    own = out["own-tool"]["response"]["body"]
    assert "openrelay" not in own and [item["type"] for item in own["output"]] == ["function_call"]
    assert own["output"][0]["name"] == "lookup"
    [own_sent] = sent(engine, "mine")
    assert own_sent["tools"][0] == own_tool
    assert {t["name"] for t in own_sent["tools"][1:]} == {"add", "echo", "explode", "huge", "slow"}

    assert err["forever"]["error"] == {"code": "tool_rounds_exceeded",
                                       "message": "the model still called tools after max_rounds (2) tool rounds"}
    assert batch["usage"] == usage_of(out)  # the failed record's turns are not billed
    calls = http_client.get(mcp_root + "/calls", timeout=10).json()
    assert sorted(c["tool"] for c in calls) == ["add"] + ["echo"] * 5
