"""Anthropic's Message Batches (/v1/messages/batches) with the official `anthropic` SDK, on the test engine, which
speaks only chat completions: every request goes to it translated (engines/messages_chat.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anthropic
import orjson
import pytest

from tests.support.batches import chat, cost, create
from tests.support.browser import signed_in_client
from tests.support.polling import wait_for
from tests.support.server import Server, catalog_text

SERVER_PER_MODULE = True  # one server, each test a fresh organization (tests/conftest.py)


def sdk(server: Server, api_key: str | None = None, **options: Any) -> anthropic.Anthropic:
    """Anthropic's SDK as its users make it: the server's root as base URL, the key sent as ``x-api-key``."""
    if "auth_token" not in options:
        options["api_key"] = api_key or server.api_key
    return anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), max_retries=0, timeout=60, **options)


def request(custom_id: str, text: str = "hi", model: str = "test/echo", **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id,
            "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **params}}


def chat_batch(server: Server) -> str:
    """An OpenRelay batch of chat completions, made through the OpenAI route; its id."""
    return create(server, [chat("c")])["id"]


def ended(client: anthropic.Anthropic, batch_id: str) -> Any:
    return wait_for(lambda: (b := client.messages.batches.retrieve(batch_id)).processing_status == "ended" and b,
                    f"message batch {batch_id} to end", timeout=120)


def results(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    return {r.custom_id: r.result for r in client.messages.batches.results(batch_id)}


def test_create_run_and_read_results_with_the_sdk(server, engine):
    client = sdk(server)
    made = client.messages.batches.create(requests=[
        request("plain", "hello there", system=[{"type": "text", "text": "Be brief."}],
                stop_sequences=["STOP"], temperature=0.5),
        request("blocks", "", messages=[{"role": "user", "content": [{"type": "text", "text": "first"},
                                                                     {"type": "text", "text": "second"}]}]),
        request("unknown-model", model="test/nope"),
        request("no-max-tokens") | {"params": {"model": "test/echo", "messages": [{"role": "user", "content": "x"}]}},
    ])
    assert made.type == "message_batch" and made.processing_status == "in_progress"
    assert made.results_url is None and made.ended_at is None and made.created_at.tzinfo is not None
    assert (made.expires_at - made.created_at).total_seconds() == 86400
    assert made.request_counts.processing + made.request_counts.errored == 4
    batch = ended(client, made.id)
    assert batch.results_url == f"{server.base_url}/messages/batches/{made.id}/results"
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 2, 2, 0, 0)
    found = results(client, made.id)
    assert set(found) == {"plain", "blocks", "unknown-model", "no-max-tokens"}
    message = found["plain"].message
    assert found["plain"].type == "succeeded" and message.type == "message" and message.role == "assistant"
    assert message.model == "test/echo" and message.content[0].text == "echo: hello there"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_read_input_tokens == 0
    assert found["blocks"].message.content[0].text == "echo: first\nsecond"
    refused = found["unknown-model"]
    assert refused.type == "errored" and refused.error.type == "error"
    assert refused.error.error.type == "invalid_request_error"
    assert refused.error.error.message.startswith('requests.2: model "test/nope" is not offered for batch')
    assert found["no-max-tokens"].error.error.type == "invalid_request_error"
    assert "max_tokens" in found["no-max-tokens"].error.error.message
    # What the engine was sent: chat completions, the system prompt a system message, stop_sequences as stop.
    sent = {r["body"]["messages"][-1]["content"]: r for r in engine.requests()}
    plain = sent["hello there"]
    assert plain["path"] == "/v1/chat/completions"
    assert plain["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert plain["body"]["stop"] == ["STOP"] and plain["body"]["max_tokens"] == 64
    assert plain["body"]["temperature"] == 0.5 and plain["body"]["model"] == "echo-served"
    assert "first\nsecond" in sent


def test_a_message_batch_is_an_openrelay_batch_of_the_messages_endpoint(server):
    client = sdk(server)
    made = client.messages.batches.create(requests=[request("a", "one"), request("b", "two #cached_tokens=2")])
    ended(client, made.id)
    batch = server.client().batches.retrieve(made.id)  # the OpenAI SDK sees the same batch
    assert batch.endpoint == "/v1/messages" and batch.status == "completed" and batch.model == "test/echo"
    lines = {orjson.loads(line)["custom_id"]: orjson.loads(line)
             for line in server.client().files.content(batch.output_file_id).content.splitlines()}
    body = lines["b"]["response"]["body"]
    assert body["type"] == "message" and body["model"] == "test/echo"
    usage = body["usage"]
    assert usage["cache_read_input_tokens"] == 2
    # Billed as any record: input = input_tokens + the cache reads, the cached ones at the cached rate.
    prompt = sum(line["response"]["body"]["usage"]["input_tokens"]
                 + line["response"]["body"]["usage"]["cache_read_input_tokens"] for line in lines.values())
    output = sum(line["response"]["body"]["usage"]["output_tokens"] for line in lines.values())
    assert batch.usage.input_tokens == prompt and batch.usage.input_tokens_details.cached_tokens == 2
    assert batch.usage.output_tokens == output
    assert batch.usage.model_extra["cost_nano_usd"] == cost(prompt, output)
    shown = server.orl("batches", "get", made.id)
    assert shown.returncode == 0 and orjson.loads(shown.stdout)["endpoint"] == "/v1/messages"
    with signed_in_client(server) as (page, _csrf):
        html = page.get(f"/batches/{made.id}").text
    assert "test/echo · /v1/messages · standard" in html and "echo: one" in html  # the message's text


def test_list_pages_newest_first_both_ways(server):
    client = sdk(server)
    made = [client.messages.batches.create(requests=[request(f"r{i}")]).id for i in range(3)]
    chat_batch(server)
    assert [b.id for b in client.messages.batches.list(limit=2)] == made[::-1]  # auto-paginated; no chat batch
    first = client.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == made[:0:-1] and first.has_more
    assert (first.first_id, first.last_id) == (made[2], made[1])
    older = client.messages.batches.list(limit=2, after_id=made[1])
    assert [b.id for b in older.data] == [made[0]] and not older.has_more
    newer = client.messages.batches.list(limit=1, before_id=made[0])
    assert [b.id for b in newer.data] == [made[1]] and newer.has_more
    assert [b.id for b in client.messages.batches.list(limit=5, before_id=made[0]).data] == made[:0:-1]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.list(after_id="batch_000000000000")


def test_cancel_then_delete_once_ended(server, engine):
    client = sdk(server)
    made = client.messages.batches.create(requests=[request(f"r{i}", "#hold=msgcancel") for i in range(12)])
    engine.wait_held("msgcancel", 8)  # the model's concurrency: 8 in flight, 4 not started
    with pytest.raises(anthropic.ConflictError) as refused:
        client.messages.batches.delete(made.id)
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    cancelling = client.messages.batches.cancel(made.id)
    assert cancelling.processing_status == "canceling" and cancelling.cancel_initiated_at is not None
    wait_for(lambda: f"batch {made.id}: cancelling; this worker starts no more" in server.log(), "the worker to see it")
    engine.release("msgcancel")
    batch = ended(client, made.id)
    counts = batch.request_counts
    assert (counts.succeeded, counts.canceled, counts.errored, counts.processing) == (8, 4, 0, 0)
    assert Counter(r.type for r in results(client, made.id).values()) == {"succeeded": 8, "canceled": 4}
    assert server.client().batches.retrieve(made.id).status == "cancelled"
    gone = client.messages.batches.delete(made.id)
    assert (gone.id, gone.type) == (made.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.batches.retrieve(made.id)
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert server.http("GET", f"/batches/{made.id}").status_code == 404
    assert server.http("GET", f"/files/file-{made.id}-output").status_code == 404


def test_keys_errors_and_what_other_organizations_see(server):
    client = sdk(server)
    made = client.messages.batches.create(requests=[request("a")])
    with pytest.raises(anthropic.AuthenticationError) as refused:
        sdk(server, api_key="sk-wrong").messages.batches.list()
    assert refused.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                             "message": "Incorrect API key provided."},
                                  "request_id": refused.value.request_id}  # Anthropic's envelope carries it
    assert refused.value.request_id.startswith("req_")
    assert sdk(server, auth_token=server.api_key).messages.batches.retrieve(made.id).id == made.id  # Bearer
    other = sdk(server, api_key=server.new_org_key())
    for call in (lambda c: c.messages.batches.retrieve(made.id), lambda c: c.messages.batches.cancel(made.id)):
        with pytest.raises(anthropic.NotFoundError) as missing:
            call(other)
        assert missing.value.body["error"] == {"type": "not_found_error",
                                               "message": f"No such Batch object: {made.id}"}
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(chat_batch(server))  # a batch of another endpoint is no message batch
    answer = server.http("POST", "/messages/batches", json={"requests": [request("a")], "extra": 1})
    assert answer.status_code == 400 and answer.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "extra: Extra inputs are not permitted"},
        "request_id": answer.headers["x-request-id"]}
    answer = server.http("POST", "/messages/batches", json={"requests": []})
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    answer = server.http("POST", "/messages", json=request("a")["params"])  # Anthropic's synchronous route
    assert answer.status_code == 404 and "Send them as Anthropic's Message Batches (POST /v1/messages/batches" in (
        answer.json()["error"]["message"])
    answer = server.http("GET", f"/messages/batches/{made.id}/nothing-here")
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "not_found_error"
    for missing_key in ({}, {"x-api-key": ""}):
        answer = server.http("GET", "/messages/batches", api_key="", headers=missing_key)
        assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"


def test_results_wait_for_the_end(server, engine):
    client = sdk(server)
    made = client.messages.batches.create(requests=[request("a", "#hold=msgresults")])
    engine.wait_held("msgresults")
    with pytest.raises(anthropic.AnthropicError, match="No `results_url`"):
        client.messages.batches.results(made.id)  # the SDK reads results_url first: null while it runs
    answer = server.http("GET", f"/messages/batches/{made.id}/results")
    assert answer.status_code == 409 and answer.json()["error"]["type"] == "invalid_request_error"
    engine.release("msgresults")
    ended(client, made.id)
    assert results(client, made.id)["a"].type == "succeeded"


def test_idempotency_key_replays_the_create(server):
    client = sdk(server)
    requests = [request("a")]
    first = client.messages.batches.create(requests=requests, extra_headers={"Idempotency-Key": "k-1"})
    again = client.messages.batches.create(requests=requests, extra_headers={"Idempotency-Key": "k-1"})
    assert again.id == first.id
    with pytest.raises(anthropic.UnprocessableEntityError):
        client.messages.batches.create(requests=[request("b")], extra_headers={"Idempotency-Key": "k-1"})
    assert [b.id for b in client.messages.batches.list()] == [first.id]


def test_a_batch_whose_every_request_is_refused_ends_with_them_errored(server):
    client = sdk(server)
    answer = server.http("POST", "/messages/batches", json={"requests": [
        request("nope", model="test/nope"), request("stream", stream=True), {"custom_id": "bare"}, "not an object"]})
    assert answer.status_code == 200 and answer.json()["request_counts"]["errored"] == 4
    batch = ended(client, answer.json()["id"])
    assert batch.request_counts.errored == 4 and batch.request_counts.succeeded == 0
    found = results(client, batch.id)
    assert {custom_id: r.type for custom_id, r in found.items()} == {
        "nope": "errored", "stream": "errored", "bare": "errored", "": "errored"}
    assert found["bare"].error.error.message == "requests.2: params is required and must be a JSON object"
    assert found["stream"].error.error.message == 'requests.1: "stream": true is not supported in batch'


def test_requests_naming_several_models_run_with_the_first(make_server, engine_url):
    """The batch runs the model of its first request that passes every other rule; a request naming another is
    its own errored result (``model_mismatch``), as a record of any batch is."""
    other = f"""
[[models]]
name = "test/other"
endpoints = ["/v1/chat/completions"]
engine = {{ kind = "openai", base_url = "{engine_url}" }}
"""
    server = make_server(catalog=catalog_text(engine_url, extra=other), env={"OPENRELAY_MAX_CREATE_BYTES": "4000"})
    client = sdk(server)
    made = client.messages.batches.create(requests=[
        request("a"), request("b", model="test/other"), request("c", model="test/embed")])
    found = results(client, ended(client, made.id).id)
    assert found["a"].type == "succeeded"
    assert found["b"].error.error.message == ('requests.1: model "test/other" differs from the batch\'s model '
                                              '"test/echo"')
    assert found["c"].error.error.message.startswith('requests.2: model "test/embed" is not offered for /v1/messages')
    # A message batch create may be as big as a batch create (here 4,000 bytes), refused in Anthropic's envelope.
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.batches.create(requests=[request(f"r{i}", "x" * 100) for i in range(40)])
    assert refused.value.status_code == 413 and refused.value.body == {"type": "error", "error": {
        "type": "request_too_large", "message": "The request body is over its 4000-byte limit."},
        "request_id": refused.value.request_id}
