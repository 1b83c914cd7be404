"""``kind = "llama-cpp"``: a GGUF chat model on the llama-server this process supervises (``llama_child``), on chat
completions, text completions and the Responses API (``responses_local``). Each record is checked here as an OpenAI
server checks it, and only OpenAI's fields go on (docs/builtin-models.md)."""

from __future__ import annotations

from typing import Any

from ..errors import error_envelope
from .base import EngineReply, EngineUnavailable
from .llama_child import running
from .params import BOOL, INT, LIST, NUMBER, OBJECT, STOP, STR, STR_OR_OBJECT, wrong_type
from .responses_local import chat_request, response_object

__all__ = ["LlamaServerEngine", "request_body"]

_SAMPLING = {"temperature": NUMBER, "top_p": NUMBER, "top_k": INT, "stop": STOP, "seed": INT,
             "presence_penalty": NUMBER, "frequency_penalty": NUMBER, "logit_bias": OBJECT}
# What goes on to llama-server, by endpoint, with the type each must have; any other field is left out.
_FIELDS = {
    "/v1/chat/completions": {**_SAMPLING, "logprobs": BOOL, "top_logprobs": INT, "response_format": OBJECT,
                             "tools": LIST, "tool_choice": STR_OR_OBJECT, "parallel_tool_calls": BOOL},
    "/v1/completions": {**_SAMPLING, "logprobs": INT, "echo": BOOL, "suffix": STR},
}
_ROLES = ("system", "developer", "user", "assistant", "tool")
_SERVED = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def request_body(endpoint: str, body: dict[str, Any], default_max_tokens: int) -> dict[str, Any] | str:
    """What goes to llama-server for a chat or text completion record, or the message of the 400 it gets."""
    text = endpoint == "/v1/completions"
    problem = _prompt_problem(body.get("prompt")) if text else _messages_problem(body.get("messages"))
    if problem is None:
        problem = wrong_type(body, _FIELDS[endpoint])
    # 0 is refused like any other count below 1, not taken for "absent".
    name = next((k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None)
    max_tokens = default_max_tokens if name is None else body[name]
    if problem is None and (type(max_tokens) is not int or max_tokens < 1):
        problem = f"{name} must be a positive integer (got {max_tokens!r:.50})"
    if problem is not None:
        return problem
    sent = {k: body[k] for k in _FIELDS[endpoint] if k in body}
    if text:
        sent["prompt"] = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
    else:
        sent["messages"] = body["messages"]
    return sent | {"model": body.get("model"), "max_tokens": max_tokens}


class LlamaServerEngine:
    def __init__(self, config: dict[str, Any], *, model_name: str) -> None:
        self.default_max_tokens = int(config.get("max_tokens", 256))
        self.model_name = model_name

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if endpoint == "/v1/responses":
            return await self._respond(body)
        if endpoint not in _SERVED:
            return EngineReply(400, error_envelope(f"{self.model_name} serves only {', '.join(_SERVED)}"))
        sent = request_body(endpoint, body, self.default_max_tokens)
        if isinstance(sent, str):
            return EngineReply(400, error_envelope(sent))
        reply = await self._send(endpoint, sent)
        if endpoint == "/v1/completions" and str(reply.body.get("id")).startswith("chatcmpl-"):
            reply.body["id"] = reply.body["id"][4:]  # a text completion's id is OpenAI's "cmpl-..."
        return reply

    async def _send(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        child = running(self.model_name)
        if child is None:
            raise EngineUnavailable(f"{self.model_name} runs on a llama-server of `orl serve` or `orl worker`, and "
                                    "none runs in this process")
        return await child.http.call(endpoint, body)

    async def _respond(self, body: dict[str, Any]) -> EngineReply:
        """``/v1/responses``: the request run as a chat, answered as a Response object (``responses_local``)."""
        request = chat_request(body, default_max_tokens=self.default_max_tokens, model_name=self.model_name)
        if isinstance(request, str):
            return EngineReply(400, error_envelope(request))
        reply = await self._send("/v1/chat/completions", {
            "model": body.get("model"), "messages": request.messages, "max_tokens": request.max_output_tokens,
            "temperature": request.temperature, "top_p": request.top_p})
        if reply.status_code != 200:
            return reply
        return EngineReply(200, response_object(reply.body, request, model_name=self.model_name))

    async def healthy(self) -> bool:
        child = running(self.model_name)
        return child is not None and await child.http.healthy()

    async def aclose(self) -> None:
        """Nothing of its own: the server belongs to the process (``llama_child.supervising``)."""


def _prompt_problem(prompt: Any) -> str | None:
    """What an OpenAI server would say of a ``prompt`` this model cannot take, or None: one text per request."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return "prompt: field required (a string; this model takes one prompt per request)"
    if not prompt:
        return "prompt: must not be empty"
    return None


def _messages_problem(messages: Any) -> str | None:
    """What an OpenAI server would say of a malformed ``messages`` list, or None."""
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages[{i}]: must be an object"
        role = message.get("role")
        if role not in _ROLES:
            return f"messages[{i}].role: must be one of {', '.join(_ROLES)} (got {str(role)[:50]!r})"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"messages[{i}].content: must be a string or a list of content parts"
        if content is None and role != "assistant":
            return f"messages[{i}].content: field required"
    return None
