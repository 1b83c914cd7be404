"""``kind = "openai"``: any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, TGI, Ollama) over HTTP, with
pyreqwest (Rust's reqwest: connections, parsing and timeouts off the GIL; why: docs/benchmarks.md)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import msgspec
import orjson
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import PyreqwestError, RequestTimeoutError

from .. import tracing
from ..errors import error_envelope
from .base import EngineReply, EngineTimedOut, EngineUnavailable

__all__ = ["OpenAIEngine"]

_encode = msgspec.json.Encoder().encode


class OpenAIEngine:
    def __init__(self, config: dict[str, Any], *, max_connections: int) -> None:
        self.base_url = str(config["base_url"]).rstrip("/")
        self.served_model = config.get("served_model")
        # Ollama's and llama-cpp-python's servers read max_tokens and silently ignore max_completion_tokens.
        self.legacy_max_tokens = bool(config.get("legacy_max_tokens", False))
        # Sent as every call's ``priority`` (a record's own is replaced): an engine that schedules by priority
        # serves interactive requests (priority 0) first (docs/engines.md, "Sharing an engine ...").
        self.priority = config.get("engine_priority")
        self.headers = {"content-type": "application/json"}
        key_env = config.get("api_key_env")
        if key_env and os.environ.get(key_env):
            self.headers["authorization"] = f"Bearer {os.environ[key_env]}"
        self.timeout = timedelta(seconds=float(config.get("timeout_seconds", 600)))
        self.connect_timeout = timedelta(seconds=float(config.get("connect_timeout_seconds", 10)))
        self.max_connections = max_connections
        self._client: Client | None = None

    def _url(self, endpoint: str) -> str:
        # Catalog base URLs end in /v1 like the endpoints start with it; join them once.
        path = endpoint[3:] if endpoint.startswith("/v1/") and self.base_url.endswith("/v1") else endpoint
        return self.base_url + path

    def _http(self) -> Client:
        if self._client is None:
            self._client = (ClientBuilder().max_connections(self.max_connections).timeout(self.timeout)
                            .connect_timeout(self.connect_timeout).default_headers(self.headers).no_proxy()
                            .follow_redirects(False).gzip(False).brotli(False).zstd(False).deflate(False)
                            .build())
        return self._client

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if self.served_model:
            body = {**body, "model": self.served_model}
        if self.legacy_max_tokens and "max_completion_tokens" in body and "max_tokens" not in body:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        if self.priority is not None:
            body = {**body, "priority": self.priority}
        try:
            # msgspec writes integers of any size with every digit (orjson refuses those past 64 bits).
            payload = _encode(body)
        except (msgspec.EncodeError, TypeError, ValueError, RecursionError) as exc:  # this record's problem only
            return EngineReply(400, error_envelope(f"the request body cannot be sent: {exc}"))
        try:
            # The record's x-request-id (vLLM logs it as the request's own) and, when tracing, its traceparent.
            request = self._http().post(self._url(endpoint)).headers(tracing.call_headers())
            response = await request.body_bytes(payload).build().send()
            status, content = response.status, (await response.bytes()).to_bytes()
        except RequestTimeoutError as exc:
            raise EngineTimedOut("engine timed out") from exc
        except (PyreqwestError, OSError) as exc:  # refused, reset, closed early: no answer came
            raise EngineUnavailable(f"engine unreachable: {exc.__class__.__name__}: {exc}") from exc
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            text = content[:500].decode("utf-8", "replace")
            status = status if status >= 400 else 502
            kind = "server_error" if status >= 500 else "invalid_request_error"
            return EngineReply(status, error_envelope(f"engine answered a non-JSON body: {text}", type_=kind))
        return EngineReply(status, parsed)

    async def healthy(self) -> bool:
        """``GET /models`` is the one route every OpenAI-compatible server has; any answer below 500 (even a
        401 or 404) means a server is there and working."""
        try:
            request = self._http().get(self._url("/v1/models")).timeout(timedelta(seconds=5)).build()
            return (await request.send()).status < 500
        except (PyreqwestError, OSError):
            return False

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
