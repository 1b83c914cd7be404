"""The Responses API (``/v1/responses``) for the built-in chat model: a request read as a chat, the chat's
completion written back as a Response object. A field asking for what a local model cannot do is a 400 naming it,
never silently dropped; which fields are which: docs/builtin-models.md."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..clock import now

__all__ = ["ChatRequest", "chat_request", "response_object"]

_DEFAULT_TEMPERATURE = 1.0  # OpenAI's defaults for the Responses API, sent explicitly so the answer can echo them
_DEFAULT_TOP_P = 1.0
_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"user": ("input_text",), "system": ("input_text",), "developer": ("input_text",),
               "assistant": ("output_text", "refusal")}
_READ = ("input", "instructions", "max_output_tokens", "temperature", "top_p", "metadata")
_IGNORED = ("model", "user", "safety_identifier", "prompt_cache_key", "service_tier", "truncation",
            "parallel_tool_calls")  # they change nothing for a local model, whatever their value
_UNSUPPORTED = {  # what such a field asks for when it is set to something (see ``_asks_for_it``)
    "tools": "tool calling", "tool_choice": "tool calling", "max_tool_calls": "tool calling",
    "reasoning": "reasoning", "previous_response_id": "earlier responses", "conversation": "conversations",
    "prompt": "stored prompts", "store": "storing responses", "background": "background responses",
    "text": "output formats other than plain text", "top_logprobs": "log probabilities",
    "include": "extra output items", "stream": "streaming", "stream_options": "streaming",
}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A Responses request as the chat model runs it, and what the Response object echoes of it."""

    messages: list[dict[str, str]]
    max_output_tokens: int
    temperature: float
    top_p: float
    instructions: str | None
    metadata: dict[str, Any]


def chat_request(body: dict[str, Any], *, default_max_tokens: int, model_name: str) -> ChatRequest | str:
    """The chat to run for ``body``, or the message of the 400 it gets."""
    for name, value in body.items():
        if name in _READ or name in _IGNORED:
            continue
        if name not in _UNSUPPORTED:
            return f"{name}: unknown parameter for /v1/responses on {model_name}"
        if _asks_for_it(name, value):
            return f"{name}: {model_name} does not support {_UNSUPPORTED[name]} on /v1/responses"
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return "instructions: must be a string"
    messages = _messages(body.get("input"))
    if isinstance(messages, str):
        return messages
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    max_tokens = body.get("max_output_tokens")
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if type(max_tokens) is not int or max_tokens < 1:
        return f"max_output_tokens: must be a positive integer (got {max_tokens!r:.50})"
    sampling = {}
    for name, default, top in (("temperature", _DEFAULT_TEMPERATURE, 2.0), ("top_p", _DEFAULT_TOP_P, 1.0)):
        value = body.get(name)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
            return f"{name}: must be a number from 0 to {top:g} (got {value!r:.50})"
        sampling[name] = float(value)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return "metadata: must be an object"
    return ChatRequest(messages=messages, max_output_tokens=max_tokens, instructions=instructions,
                       metadata=metadata or {}, **sampling)


def _asks_for_it(name: str, value: Any) -> bool:
    """Whether an unsupported field asks for something, rather than saying "none" in its own way."""
    if value is None or value == [] or value == {}:
        return False
    if name in ("store", "background", "stream"):
        return value is not False
    if name == "tool_choice":
        return value not in ("auto", "none")  # with no tools either means: answer in text
    if name == "text":
        return not _plain_text(value)
    return True


def _plain_text(text: Any) -> bool:
    """``text: {"format": {"type": "text"}}`` (the default output format), with or without a verbosity."""
    if not isinstance(text, dict):
        return False
    fmt = text.get("format")
    return set(text) <= {"format", "verbosity"} and (fmt is None or fmt == {"type": "text"})


def _messages(given: Any) -> list[dict[str, str]] | str:
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        return "input: field required (a string or a non-empty list of messages)"
    messages = []
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            return f"input[{i}]: must be an object"
        kind = item.get("type", "message")
        if kind != "message":
            return f"input[{i}]: items of type {str(kind)[:50]!r} are not supported by this model (only messages)"
        role = item.get("role")
        if role not in _ROLES:
            return f"input[{i}].role: must be one of {', '.join(_ROLES)} (got {str(role)[:50]!r})"
        text = _text(item.get("content"), _TEXT_PARTS[role])
        if not isinstance(text, str):
            return f"input[{i}].content: {text[0]}"
        # The chat template knows system, not developer: the two mean the same to a model without a hierarchy.
        messages.append({"role": "system" if role == "developer" else role, "content": text})
    return messages


def _text(content: Any, kinds: tuple[str, ...]) -> str | tuple[str]:
    """The content's text, or (why it cannot be read,)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ("must be a string or a list of content parts",)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            return (f"part {j} is of type {str(kind)[:50]!r}; this model reads only {' and '.join(kinds)} parts",)
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            return (f"part {j} has no text",)
        texts.append(text)
    return "".join(texts)


def response_object(completion: dict[str, Any], request: ChatRequest, *, model_name: str) -> dict[str, Any]:
    """The Response object for the chat model's ``completion`` of ``request``."""
    choice = completion["choices"][0]
    text = choice["message"].get("content") or ""
    cut = choice.get("finish_reason") == "length"
    usage = completion.get("usage") or {}
    input_tokens, output_tokens = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": now(),
        "status": "incomplete" if cut else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "model": model_name,
        "output": [{
            "type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "incomplete" if cut else "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": False,
        "temperature": request.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": {"input_tokens": input_tokens,
                  "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                  "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
        "user": None,
        "metadata": request.metadata,
    }
