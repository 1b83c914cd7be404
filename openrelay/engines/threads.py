"""The threads an in-process engine runs its model on: a pool of its own, sized to its concurrency. Not asyncio's
default pool, where the worker runs its own blocking work (lease renewals, durable result writes, DNS lookups):
inference filling that one would hold a lease renewal back until the lease ran out."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["EngineThreads"]

T = TypeVar("T")


class EngineThreads:
    def __init__(self, size: int, model_name: str) -> None:
        self.size = max(1, size)
        self._name = f"engine {model_name}"
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the engine's threads, as ``asyncio.to_thread`` runs it (context too)."""
        if self._pool is None:  # made on first use, and again after close: an engine may be used after aclose
            self._pool = ThreadPoolExecutor(self.size, thread_name_prefix=self._name)
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Without waiting: a run in progress finishes on its own, and nothing queued behind it starts."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
