"""Anthropic's Messages API over a chat-completions engine (engines/messages_chat.py), what maps to what, and a
batch's result lines as Anthropic's results (service/message_batches.py). The whole route, on real servers, is
tests/test_message_batches.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openrelay.catalog import parse_catalog
from openrelay.engines.base import EngineReply
from openrelay.engines.counting import approximate_tokens
from openrelay.engines.factory import build_replicas, check_engines
from openrelay.engines.messages_chat import MessagesOverChat, chat_request, message_of
from openrelay.errors import CatalogError
from openrelay.service.message_batches import result_line
from openrelay.web.answers import answer_text
from openrelay.worker.usage import RecordUsage, record_usage

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def params(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_a_request_becomes_a_chat_completion():
    body = chat_request(params(
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in French.",
                                                             "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Read this:"}, IMAGE]},
                  {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And?"}],
        stop_sequences=["\n\n", "END"], temperature=0.2, top_p=0.9, top_k=40, metadata={"user_id": "u-1"}))
    assert body == {
        "model": "m", "max_tokens": 16, "temperature": 0.2, "top_p": 0.9, "top_k": 40, "stop": ["\n\n", "END"],
        "messages": [
            {"role": "system", "content": "You are terse.\nAnswer in French."},
            {"role": "user", "content": [{"type": "text", "text": "Read this:"}, {
                "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "And?"}]}
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert chat_request(params(messages=[{"role": "user", "content": [url]}]))["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    assert chat_request(params(tools=[], thinking={"type": "disabled"}, stream=False)) == chat_request(params())


@pytest.mark.parametrize(("extra", "problem"), [
    ({"max_tokens": None}, "max_tokens: Field required (an integer >= 1)"),
    ({"max_tokens": 0}, "max_tokens: Field required (an integer >= 1)"),
    ({"messages": []}, "messages: Field required (a non-empty list)"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role: must be 'user' or 'assistant'"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages.0.content: must be a string or a list of content"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages.0.content.0: 'document' blocks are not supported by this model's engine"),
    ({"system": [IMAGE]}, "system.0: 'image' blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]},
     "messages.0.content.0.source: must be {type: base64, media_type, data} or {type: url, url}"),
    ({"tools": [{"name": "f", "input_schema": {}}]}, "tools: tool use is not supported by this model's engine"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking: extended thinking is not supported"),
    ({"stop_sequences": "END"}, "stop_sequences: must be a list of strings"),
    ({"frobnicate": 1}, "frobnicate: Extra inputs are not permitted"),
])
def test_what_a_chat_completion_cannot_carry_is_refused_by_name(extra, problem):
    engine = MessagesOverChat(_Chat({}))
    reply = asyncio.run(engine.call("/v1/messages", {**params(), **extra}))
    assert reply.status_code == 400 and reply.body["error"]["message"].startswith(problem)
    assert engine.engine.sent == []  # nothing reached the engine


class _Chat:
    """An engine that speaks only chat completions, answering ``answer``."""

    def __init__(self, answer: dict[str, Any], status: int = 200) -> None:
        self.answer, self.status, self.sent = answer, status, []

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        self.sent.append((endpoint, body))
        return EngineReply(self.status, self.answer)


def completion(text: str | None = "Bonjour.", finish: str = "stop", **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "served",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                         **choice}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34,
                      "prompt_tokens_details": {"cached_tokens": 12}}}


def test_a_completion_becomes_a_message():
    engine = MessagesOverChat(_Chat(completion()))
    reply = asyncio.run(engine.call("/v1/messages", params()))
    assert engine.engine.sent[0][0] == "/v1/chat/completions"
    message = reply.body
    assert reply.status_code == 200 and message["id"].startswith("msg_")
    assert {k: v for k, v in message.items() if k != "id"} == {
        "type": "message", "role": "assistant", "model": "served", "content": [{"type": "text", "text": "Bonjour."}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 18, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 12,
                  "output_tokens": 4}}
    # Billed as the chat completion was: 30 prompt tokens, 12 of them cached.
    assert record_usage("/v1/messages", message) == RecordUsage(input_tokens=30, cached_tokens=12, output_tokens=4)
    assert answer_text({"response": {"status_code": 200, "body": message}}) == "Bonjour."


@pytest.mark.parametrize(("finish", "choice", "reason", "sequence"), [
    ("length", {}, "max_tokens", None),
    ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),  # vLLM says which stop string matched
    ("stop", {"stop_reason": 2}, "end_turn", None),  # ... or the token id of an end of sequence
    ("content_filter", {}, "refusal", None),
    (None, {}, "end_turn", None),
    (["stop"], {}, "end_turn", None),  # an engine's odd finish_reason: read as none, not a TypeError (unhashable)
])
def test_stop_reasons(finish, choice, reason, sequence):
    message = message_of(completion(finish=finish, **choice), params(stop_sequences=["END"]))
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def test_an_empty_answer_and_an_engine_refusal():
    assert message_of(completion(text=None), params())["content"] == []
    refusal = {"error": {"message": "context too long", "type": "invalid_request_error"}}
    assert asyncio.run(MessagesOverChat(_Chat(refusal, 400)).call("/v1/messages", params())) == EngineReply(
        400, refusal)  # the engine's own 4xx, as it gave it: the record's error line
    reply = asyncio.run(MessagesOverChat(_Chat({"choices": []})).call("/v1/messages", params()))
    assert reply.status_code == 502
    other = asyncio.run(MessagesOverChat(_Chat(completion())).call("/v1/chat/completions", {"x": 1}))
    assert other.body == completion()  # other endpoints pass through untouched


def test_a_dry_run_counts_a_message_request_by_the_approximate_rule():
    body = params(system="abcdefgh", messages=[{"role": "user", "content": [{"type": "text", "text": "abcd"}, IMAGE]}])
    assert approximate_tokens("/v1/messages", body) == 2 + (3 + 4 + 1 + 85)  # system; priming, message, text, image


CATALOG = """
[[models]]
name = "{name}"
endpoints = {endpoints}
engine = {engine}
"""


def _catalog(endpoints: str, engine: str = '{ kind = "openai", base_url = "http://127.0.0.1:9/v1" }'):
    return parse_catalog(CATALOG.format(name="m", endpoints=endpoints, engine=engine))


def test_which_engines_translate():
    chat = _catalog('["/v1/chat/completions"]').models["m"]
    assert chat.endpoints == ("/v1/chat/completions", "/v1/messages") and not chat.speaks_messages
    assert isinstance(build_replicas(chat)[0][1], MessagesOverChat)
    native = _catalog('["/v1/chat/completions", "/v1/messages"]').models["m"]
    assert native.speaks_messages and not isinstance(build_replicas(native)[0][1], MessagesOverChat)
    assert _catalog('["/v1/embeddings"]').models["m"].endpoints == ("/v1/embeddings",)
    local = _catalog('["/v1/messages"]', '{ kind = "rapidocr" }')
    with pytest.raises(CatalogError, match="cannot list /v1/messages"):
        check_engines(local)


@pytest.mark.parametrize(("line", "result"), [
    ({"custom_id": "a", "response": {"status_code": 200, "body": {"type": "message"}}, "error": None},
     {"type": "succeeded", "message": {"type": "message"}}),
    ({"custom_id": "a", "response": None, "error": {"code": "batch_cancelled", "message": "..."}},
     {"type": "canceled"}),
    ({"custom_id": "a", "response": None, "error": {"code": "batch_expired", "message": "..."}}, {"type": "expired"}),
    ({"custom_id": "a", "response": None, "error": {"code": "x", "message": "too long", "status_code": 400}},
     {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error",
                                                              "message": "too long"}}}),
    ({"custom_id": "a", "response": None, "error": {"code": "server_error", "message": "down", "status_code": 503}},
     {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "down"}}}),
    ({"custom_id": "a", "response": None, "error": {"code": "batch_failed", "message": "the batch failed"}},
     {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "the batch failed"}}}),
    ({"custom_id": "a", "response": None, "error": {"code": "missing_model",
                                                    "message": "line 3: body.model is required and must be a string"}},
     {"type": "errored", "error": {"type": "error", "error": {
         "type": "invalid_request_error", "message": "requests.2: params.model is required and must be a string"}}}),
])
def test_result_lines_as_anthropic_results(line, result):
    assert result_line(line) == {"custom_id": "a", "result": result}
