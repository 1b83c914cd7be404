"""Anthropic's Messages API (``/v1/messages``) on an engine that speaks only chat completions: each request
translated to a chat completion, each completion back to a Message. What maps to what, and what is refused:
docs/api-contract.md, "Anthropic's Message Batches"."""

from __future__ import annotations

import uuid
from typing import Any

from ..catalog import CHAT, MESSAGES
from ..errors import error_envelope
from .base import Engine, EngineReply

__all__ = ["MessagesOverChat", "chat_request", "message_of"]

_PASSED = ("temperature", "top_p", "top_k")  # the same name and meaning in a chat completion
_IGNORED = ("metadata", "service_tier")  # they change nothing a chat engine does
_UNSUPPORTED = {"tools": "tool use", "tool_choice": "tool use", "thinking": "extended thinking",
                "mcp_servers": "MCP servers", "container": "containers", "context_management": "context management"}
_KNOWN = ("model", "max_tokens", "messages", "system", "stop_sequences", "stream", *_PASSED, *_IGNORED, *_UNSUPPORTED)
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                 "content_filter": "refusal"}


class _Refused(Exception):
    """A request that cannot be run as a chat completion; ``str(exc)`` is the 400's message."""


def chat_request(params: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body of a Messages request; ``_Refused`` when it asks for what a chat completion here
    cannot carry, or breaks a rule of Anthropic's that the create does not check (``max_tokens``, roles, blocks)."""
    for name, value in params.items():
        if name not in _KNOWN:
            raise _Refused(f"{name}: Extra inputs are not permitted")
        if name in _UNSUPPORTED and value and value != {"type": "disabled"}:
            raise _Refused(f"{name}: {_UNSUPPORTED[name]} is not supported by this model's engine, which runs "
                           "message requests as chat completions")
    max_tokens = params.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        raise _Refused("max_tokens: Field required (an integer >= 1)")
    raw = params.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _Refused("messages: Field required (a non-empty list)")
    messages = []
    system = params.get("system")
    if system is not None:
        text = _content(system, "system", images=False)
        if text:
            messages.append({"role": "system", "content": text})
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _Refused(f"messages.{i}.role: must be 'user' or 'assistant'")
        messages.append({"role": message["role"],
                         "content": _content(message.get("content"), f"messages.{i}.content", images=True)})
    body: dict[str, Any] = {"model": params.get("model"), "messages": messages, "max_tokens": max_tokens}
    body.update((name, params[name]) for name in _PASSED if name in params)
    stops = params.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _Refused("stop_sequences: must be a list of strings")
        if stops:
            body["stop"] = stops
    return body


def _content(content: Any, where: str, *, images: bool) -> str | list[dict[str, Any]]:
    """A string, or content blocks as chat content: one string when every block is text (any engine reads that),
    else parts, images as ``image_url`` (a data URL for base64 sources)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _Refused(f"{where}: must be a string or a list of content blocks")
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and images:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), f"{where}.{j}")}})
        else:
            raise _Refused(f"{where}.{j}: {str(kind)[:40]!r} blocks are not supported by this model's engine, which "
                           "runs message requests as chat completions (text" + (" and image" if images else "")
                           + " blocks are)")
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _image_url(source: Any, where: str) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return f"data:{media};base64,{data}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise _Refused(f"{where}.source: must be {{type: base64, media_type, data}} or {{type: url, url}}")


def message_of(completion: dict[str, Any], params: dict[str, Any]) -> dict[str, Any] | None:
    """The Message of a chat completion answering ``params``; None when it has no choice to read."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if choice is None:
        return None
    message = found if isinstance(found := choice.get("message"), dict) else {}
    text = message.get("content")
    finish = found if isinstance(found := choice.get("finish_reason"), str) else ""  # a list would not hash
    reason, sequence = _STOP_REASONS.get(finish, "end_turn"), None
    matched = choice.get("stop_reason")  # vLLM's: the stop string that ended the answer
    if finish == "stop" and isinstance(matched, str) and matched in (params.get("stop_sequences") or ()):
        reason, sequence = "stop_sequence", matched
    usage = found if isinstance(found := completion.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details")
    prompt, cached = _count(usage, "prompt_tokens"), _count(details if isinstance(details, dict) else {},
                                                           "cached_tokens")
    cached = min(cached, prompt)
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
        "model": completion.get("model") or params.get("model"),
        "content": [{"type": "text", "text": text}] if isinstance(text, str) and text else [],
        "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": cached, "output_tokens": _count(usage, "completion_tokens")},
    }


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if type(value) is int and value > 0 else 0


class MessagesOverChat:
    """``engine`` (which speaks chat completions), serving ``/v1/messages`` too by translation; every other
    endpoint goes to it as it is."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if endpoint != MESSAGES:
            return await self.engine.call(endpoint, body)
        try:
            request = chat_request(body)
        except _Refused as exc:
            return EngineReply(400, error_envelope(str(exc)))
        reply = await self.engine.call(CHAT, request)
        if not 200 <= reply.status_code < 300:
            return reply
        message = message_of(reply.body, body)
        if message is None:
            return EngineReply(502, error_envelope("the engine's chat completion has no choice", type_="server_error"))
        return EngineReply(reply.status_code, message)

    async def healthy(self) -> bool:
        return await self.engine.healthy()

    async def aclose(self) -> None:
        await self.engine.aclose()
