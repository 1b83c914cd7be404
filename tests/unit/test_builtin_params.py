"""What the built-in models make of a record's fields before they run it: a field of the wrong type is a 400 naming
it (never an exception's text), and only OpenAI's fields go on to the chat model's llama-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openrelay.catalog import load_catalog
from openrelay.engines.factory import build_engine
from openrelay.engines.llama_chat import request_body

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(("endpoint", "field", "value", "message"), [
    (CHAT, "temperature", "hot", "temperature: must be a number (got 'hot')"),
    (CHAT, "top_p", True, "top_p: must be a number (got True)"),
    (CHAT, "seed", 1.5, "seed: must be an integer (got 1.5)"),
    (CHAT, "stop", ["a", 1], "stop: must be a string or a list of strings (got ['a', 1])"),
    (CHAT, "logprobs", 3, "logprobs: must be a boolean (got 3)"),
    (CHAT, "tools", {"type": "function"}, "tools: must be a list (got {'type': 'function'})"),
    (CHAT, "max_tokens", "many", "max_tokens must be a positive integer (got 'many')"),
    (CHAT, "max_completion_tokens", 0, "max_completion_tokens must be a positive integer (got 0)"),
    (TEXT, "logprobs", True, "logprobs: must be an integer (got True)"),
    (TEXT, "echo", "yes", "echo: must be a boolean (got 'yes')"),
    (TEXT, "presence_penalty", [1], "presence_penalty: must be a number (got [1])"),
])
def test_a_field_of_the_wrong_type_is_refused_by_name(endpoint: str, field: str, value: Any, message: str) -> None:
    body: dict[str, Any] = {"model": "m", **({"messages": HI} if endpoint == CHAT else {"prompt": "Hi"})}
    assert request_body(endpoint, {**body, field: value}, 256) == message


def test_only_openais_fields_go_on_with_a_max_tokens_always_set() -> None:
    sent = request_body(CHAT, {"model": "m", "messages": HI, "temperature": 0, "n_predict": 100_000,
                               "grammar": "root ::= x", "max_completion_tokens": 5, "frobnicate": 1}, 256)
    assert sent == {"model": "m", "messages": HI, "temperature": 0, "max_tokens": 5}
    assert request_body(TEXT, {"model": "m", "prompt": ["Once"], "echo": True}, 256) == {
        "model": "m", "prompt": "Once", "echo": True, "max_tokens": 256}
    assert request_body(TEXT, {"model": "m", "prompt": ["a", "b"]}, 256) == (
        "prompt: field required (a string; this model takes one prompt per request)")


@pytest.mark.parametrize(("model", "endpoint", "body", "message"), [
    ("openrelay/minilm-l6", "/v1/embeddings", {"input": "hi", "dimensions": "384"},
     "dimensions: must be an integer (got '384')"),
    ("openrelay/minilm-l6", "/v1/embeddings", {"input": "hi", "encoding_format": 1},
     "encoding_format: must be a string (got 1)"),
    ("openrelay/rapidocr", CHAT, {"messages": HI, "max_tokens": "lots"}, "max_tokens: must be an integer (got 'lots')"),
])
def test_the_in_process_models_name_a_field_of_the_wrong_type(model: str, endpoint: str, body: dict[str, Any],
                                                              message: str) -> None:
    engine = build_engine(load_catalog(None).models[model])
    reply = asyncio.run(engine.call(endpoint, {"model": model, **body}))
    assert (reply.status_code, reply.body["error"]["message"]) == (400, message)
