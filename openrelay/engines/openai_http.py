"""``kind = "openai"``: any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, TGI, Ollama) over HTTP.

aiohttp rather than httpx: at 64 connections on two cores httpx's pool delivered about a tenth of aiohttp's
requests per second against the same zero-latency engine (measured; see docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import orjson
from yarl import URL

from .base import EngineReply, EngineUnavailable, error_body

__all__ = ["OpenAIEngine"]


class OpenAIEngine:
    def __init__(self, config: dict[str, Any], *, max_connections: int) -> None:
        self.base_url = str(config["base_url"]).rstrip("/")
        self.served_model = config.get("served_model")
        # Ollama's and llama-cpp-python's servers read max_tokens and silently ignore max_completion_tokens.
        self.legacy_max_tokens = bool(config.get("legacy_max_tokens", False))
        self.headers = {"content-type": "application/json"}
        key_env = config.get("api_key_env")
        if key_env and os.environ.get(key_env):
            self.headers["authorization"] = f"Bearer {os.environ[key_env]}"
        # aiohttp keeps only the connect timeout; a call's whole time is bounded by the watchdog below.
        self.timeout_seconds = float(config.get("timeout_seconds", 600))
        self.timeout = aiohttp.ClientTimeout(total=None, connect=float(config.get("connect_timeout_seconds", 10)))
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._deadlines: dict[asyncio.Task[Any], float] = {}  # the calls in flight: their tasks and deadlines
        self._timed_out: set[asyncio.Task[Any]] = set()
        self._watchdog: asyncio.Task[None] | None = None

    def _url(self, endpoint: str) -> URL:
        """The engine's URL for a batch endpoint, parsed once: aiohttp would parse a string on every request."""
        url = self._urls.get(endpoint)
        if url is None:
            # Catalog base URLs end in /v1 like the endpoints start with it; join them once.
            path = endpoint[3:] if endpoint.startswith("/v1/") and self.base_url.endswith("/v1") else endpoint
            url = self._urls[endpoint] = URL(self.base_url + path)
        return url

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, headers=self.headers)
        return self._session

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if self.served_model:
            body = {**body, "model": self.served_model}
        if self.legacy_max_tokens and "max_completion_tokens" in body and "max_tokens" not in body:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        try:
            payload = orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # e.g. nesting deeper than orjson writes: this record's problem only
            return EngineReply(400, error_body(f"the request body cannot be sent: {exc}"))
        task = asyncio.current_task()
        assert task is not None
        self._deadlines[task] = time.monotonic() + self.timeout_seconds
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._time_out_calls())
        try:
            async with self._client().post(self._url(endpoint), data=payload) as response:
                status, content = response.status, await response.read()
        except asyncio.CancelledError:
            if task not in self._timed_out:
                raise
            self._timed_out.discard(task)
            if task.uncancel():  # cancelled by someone else as well: that cancel wins
                raise
            raise EngineUnavailable("engine timed out") from None
        except TimeoutError as exc:  # connecting took too long
            raise EngineUnavailable("engine timed out") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineUnavailable(f"engine unreachable: {exc.__class__.__name__}: {exc}") from exc
        finally:
            del self._deadlines[task]
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            text = content[:500].decode("utf-8", "replace")
            status = status if status >= 400 else 502
            kind = "server_error" if status >= 500 else "invalid_request_error"
            return EngineReply(status, error_body(f"engine answered a non-JSON body: {text}", type_=kind))
        return EngineReply(status, parsed)

    async def _time_out_calls(self) -> None:
        """Cancel each call that outlives ``timeout_seconds`` (``call`` turns that cancel into "engine timed
        out"). One task looking every so often instead of a timer per request: a timer for each of thousands of
        requests a second costs more than everything else this engine does for them."""
        period = min(1.0, self.timeout_seconds / 10)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for task, deadline in list(self._deadlines.items()):
                if deadline <= now and task not in self._timed_out:
                    self._timed_out.add(task)
                    task.cancel()

    async def healthy(self) -> bool:
        """``GET /models`` is the one route every OpenAI-compatible server has; any answer below 500 (even a
        401 or 404) means a server is there and working."""
        try:
            async with self._client().get(self._url("/v1/models"), timeout=aiohttp.ClientTimeout(total=5)) as reply:
                return reply.status < 500
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector close its transports
