"""An engine replaced at its boundary, for the unit tier: ``MockEngine(handler)`` implements the ``Engine`` protocol
(openrelay/engines/base.py) by calling ``handler(request)``, as httpx's ``MockTransport(handler)`` does for a
transport. The engine is outside the project, so this is the one double the tests use; nothing of OpenRelay's own
is replaced.

A handler takes an ``EngineRequest`` and returns an ``EngineReply`` (or a coroutine of one); it raises
``EngineUnavailable`` for a call that got no answer. ``echo`` answers as tests/support/test_engine.py does (the last
user message back, words counted as tokens); ``reply`` and ``no_answer`` make the other answers.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from openrelay.engines.base import EngineReply, EngineUnavailable
from tests.support.batches import prompt_text

__all__ = ["EngineRequest", "Handler", "MockEngine", "echo", "echo_text", "reply", "no_answer", "text_of"]


@dataclass(frozen=True)
class EngineRequest:
    endpoint: str
    body: dict[str, Any]
    replica: str  # the name the worker gave the replica (its base URL)


Handler = Callable[[EngineRequest], "EngineReply | Awaitable[EngineReply]"]


class MockEngine:
    """One engine replica whose answers come from ``handler``; ``healthy`` answers its probes (a bool, or a function
    asked at each probe). ``requests`` keeps every call, in the order they came."""

    def __init__(self, handler: Handler, *, healthy: bool | Callable[[], bool] = True, name: str = "mock") -> None:
        self.handler = handler
        self.health = healthy
        self.name = name
        self.requests: list[EngineRequest] = []
        self.probes = 0
        self.closed = False

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        request = EngineRequest(endpoint, body, self.name)
        self.requests.append(request)
        await asyncio.sleep(0)  # a call over the network gives the loop a turn, however fast its answer
        answer = self.handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer

    async def healthy(self) -> bool:
        self.probes += 1
        return self.health() if callable(self.health) else self.health

    async def aclose(self) -> None:
        self.closed = True


def reply(status: int = 200, body: dict[str, Any] | None = None, *, message: str = "") -> EngineReply:
    """An answer: ``body`` as given, or an OpenAI error envelope with ``message`` for a status that is not 2xx."""
    if body is None:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = {} if status < 300 else {"error": {"message": message or f"engine said {status}", "type": kind,
                                                  "code": None, "param": None}}
    return EngineReply(status, body)


def no_answer(message: str = "connection refused") -> NoReturn:
    """Raises as an engine does when a call got no answer at all (refused, reset, timed out)."""
    raise EngineUnavailable(message)


def text_of(request: EngineRequest) -> str:
    """The text the request asks about: the last user message, the prompt or the input."""
    return prompt_text({"body": request.body})


def echo_text(request: EngineRequest) -> str:
    return f"echo: {text_of(request)}"


def echo(request: EngineRequest) -> EngineReply:
    """The test engine's answer: the prompt back; tokens are words."""
    body = request.body
    prompt = text_of(request)
    prompt_tokens = len(prompt.split())
    if request.endpoint == "/v1/embeddings":
        data = [{"object": "embedding", "index": 0, "embedding": [0.5, -0.5]}]
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return EngineReply(200, {"object": "list", "data": data, "model": body.get("model"), "usage": usage})
    answer = echo_text(request)
    completion_tokens = len(answer.split())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    if request.endpoint == "/v1/completions":
        choice: dict[str, Any] = {"index": 0, "text": answer, "finish_reason": "stop", "logprobs": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
        obj = "chat.completion"
    return EngineReply(200, {"id": "cmpl-mock", "object": obj, "created": 0, "model": body.get("model"),
                             "choices": [choice], "usage": usage})
