"""``kind = "llama-cpp"``: a GGUF chat model run in-process on the CPU by llama.cpp, on chat completions, on text
completions (a ``prompt`` in, a ``text_completion`` out) and on the Responses API (read as a chat:
``responses_local``).

One llama.cpp context per concurrent request, each with one thread: on a small machine that beats one context
oversubscribed by many threads. The weights are memory-mapped, so the contexts share them. The contexts run on the
engine's own threads, one per context (``EngineThreads``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from ..clock import now
from ..errors import error_envelope
from .base import EngineReply, EngineUnavailable
from .packaged import packaged_file as resolve_gguf  # ``package:file.gguf``: a model shipped inside a package
from .responses_local import chat_request, response_object
from .threads import EngineThreads

__all__ = ["LlamaCppEngine", "resolve_gguf"]

# Sampling fields of a chat completion body that llama.cpp understands; others are ignored.
_PASSED = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "response_format",
           "logit_bias", "logprobs", "top_logprobs")
# The same for a text completion (``logprobs`` is a count there, and ``echo`` and ``suffix`` are its own).
_PASSED_TEXT = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
                "logprobs", "echo", "suffix")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_SERVED = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


class LlamaCppEngine:
    def __init__(self, config: dict[str, Any], *, contexts: int, model_name: str) -> None:
        self.path = resolve_gguf(str(config["gguf"]))
        self.n_ctx = int(config.get("n_ctx", 2048))
        self.default_max_tokens = int(config.get("max_tokens", 256))
        self.model_name = model_name
        self._contexts = max(1, contexts)
        self._threads = EngineThreads(self._contexts, model_name)
        self._idle: asyncio.Queue[Any] | None = None
        self._loading = asyncio.Lock()

    async def _pool(self) -> asyncio.Queue[Any]:
        async with self._loading:
            if self._idle is None:
                idle: asyncio.Queue[Any] = asyncio.Queue()
                for _ in range(self._contexts):
                    idle.put_nowait(await self._threads.run(self._load))
                self._idle = idle
        return self._idle

    def _load(self) -> Any:
        import llama_cpp  # imported on first use: the API process need not pay for it

        return llama_cpp.Llama(model_path=str(self.path), n_ctx=self.n_ctx, n_threads=1, n_threads_batch=1,
                               verbose=False)

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if endpoint == "/v1/responses":
            return await self._respond(body)
        if endpoint not in _SERVED:
            return EngineReply(400, error_envelope(f"{self.model_name} serves only {', '.join(_SERVED)}"))
        text = endpoint == "/v1/completions"
        problem = _prompt_problem(body.get("prompt")) if text else _messages_problem(body.get("messages"))
        if problem is not None:
            return EngineReply(400, error_envelope(problem))
        kwargs = {k: body[k] for k in (_PASSED_TEXT if text else _PASSED) if k in body}
        # 0 is refused like any other count below 1, not taken for "absent".
        max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None),
                          self.default_max_tokens)
        if type(max_tokens) is not int or max_tokens < 1:
            return EngineReply(400, error_envelope(f"max_tokens must be a positive integer (got {max_tokens!r:.50})"))
        kwargs["max_tokens"] = max_tokens
        if text:
            prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
            return await self._run("create_completion", "cmpl", prompt=prompt, **kwargs)
        return await self._complete(body["messages"], kwargs)

    async def _respond(self, body: dict[str, Any]) -> EngineReply:
        """``/v1/responses``: the request run as a chat, answered as a Response object (``responses_local``)."""
        request = chat_request(body, default_max_tokens=self.default_max_tokens, model_name=self.model_name)
        if isinstance(request, str):
            return EngineReply(400, error_envelope(request))
        reply = await self._complete(request.messages, {"max_tokens": request.max_output_tokens,
                                                        "temperature": request.temperature,
                                                        "top_p": request.top_p})
        if reply.status_code != 200:
            return reply
        return EngineReply(200, response_object(reply.body, request, model_name=self.model_name))

    async def _complete(self, messages: list[Any], kwargs: dict[str, Any]) -> EngineReply:
        """One chat completion on a context of the pool."""
        return await self._run("create_chat_completion", "chatcmpl", messages=messages, **kwargs)

    async def _run(self, method: str, id_prefix: str, **kwargs: Any) -> EngineReply:
        """One call of llama.cpp's ``method`` (a chat or a text completion) on a context of the pool."""
        try:
            pool = await self._pool()
        except Exception as exc:  # noqa: BLE001 - a model that cannot load: the gate treats it as an outage
            raise EngineUnavailable(f"{self.model_name} could not be loaded: {exc}") from exc
        llama = await pool.get()
        run = self._threads.submit(getattr(llama, method), **kwargs)
        # The context goes back to the pool only once its thread is done with it, even when this call is
        # cancelled while the thread still runs: two threads must never share one context.
        run.add_done_callback(lambda done: _give_back(pool, llama, done))
        try:
            result = await asyncio.shield(run)
        except Exception as exc:  # noqa: BLE001 - llama.cpp's chat template and sampler raise many kinds
            return EngineReply(400, error_envelope(f"{exc.__class__.__name__}: {exc}"[:2000]))
        result["id"] = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        result["created"] = now()
        return EngineReply(200, result)

    async def healthy(self) -> bool:
        """Alive while its model loads (or loaded); a model file that fails to load is an outage."""
        try:
            await self._pool()
        except Exception:  # noqa: BLE001
            return False
        return True

    async def aclose(self) -> None:
        self._idle = None
        self._threads.close()


def _give_back(pool: asyncio.Queue[Any], llama: Any, run: asyncio.Future[Any]) -> None:
    if not run.cancelled():
        run.exception()  # retrieved: a caller cancelled meanwhile would leave it "never retrieved"
    pool.put_nowait(llama)


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
