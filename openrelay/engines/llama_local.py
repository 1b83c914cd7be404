"""``kind = "llama-cpp"``: a GGUF chat model run in-process on the CPU by llama.cpp.

One llama.cpp context per concurrent request, each with one thread: on a small machine that beats one context
oversubscribed by many threads. The weights are memory-mapped, so the contexts share them. The contexts run on the
engine's own threads, one per context (``EngineThreads``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from .base import EngineReply, error_body
from .packaged import packaged_file as resolve_gguf  # ``package:file.gguf``: a model shipped inside a package
from .threads import EngineThreads

__all__ = ["LlamaCppEngine", "resolve_gguf"]

# Sampling fields of a chat completion body that llama.cpp understands; others are ignored.
_PASSED = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "response_format",
           "logit_bias", "logprobs", "top_logprobs")


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
        if endpoint != "/v1/chat/completions":
            return EngineReply(400, error_body(f"{self.model_name} serves only /v1/chat/completions"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return EngineReply(400, error_body("messages: field required"))
        kwargs = {k: body[k] for k in _PASSED if k in body}
        kwargs["max_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens") or \
            self.default_max_tokens
        pool = await self._pool()
        llama = await pool.get()
        try:
            result = await self._threads.run(llama.create_chat_completion, messages=messages, **kwargs)
        except (ValueError, TypeError, KeyError) as exc:
            return EngineReply(400, error_body(str(exc)))
        finally:
            pool.put_nowait(llama)
        result["id"] = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        result["created"] = int(time.time())
        return EngineReply(200, result)

    async def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._idle = None
        self._threads.close()
