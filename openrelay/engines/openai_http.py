"""``kind = "openai"``: any OpenAI-compatible server (vLLM, SGLang, llama.cpp server, TGI, Ollama) over HTTP."""

from __future__ import annotations

import os
from typing import Any

import httpx
import orjson

from .base import EngineReply, EngineUnavailable, error_body

__all__ = ["OpenAIEngine"]


class OpenAIEngine:
    def __init__(self, config: dict[str, Any], *, max_connections: int) -> None:
        self.base_url = str(config["base_url"]).rstrip("/")
        self.served_model = config.get("served_model")
        headers = {"content-type": "application/json"}
        key_env = config.get("api_key_env")
        if key_env and os.environ.get(key_env):
            headers["authorization"] = f"Bearer {os.environ[key_env]}"
        timeout = httpx.Timeout(float(config.get("timeout_seconds", 600)),
                                connect=float(config.get("connect_timeout_seconds", 10)))
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)

    def _url(self, endpoint: str) -> str:
        # Catalog base URLs end in /v1 like the endpoints start with it; join them once.
        path = endpoint[3:] if endpoint.startswith("/v1/") and self.base_url.endswith("/v1") else endpoint
        return self.base_url + path

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if self.served_model:
            body = {**body, "model": self.served_model}
        try:
            response = await self._client.post(self._url(endpoint), content=orjson.dumps(body))
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"engine timed out: {exc.__class__.__name__}") from exc
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine unreachable: {exc.__class__.__name__}: {exc}") from exc
        try:
            parsed = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            text = response.text[:500]
            kind = "server_error" if response.status_code >= 500 or response.status_code < 400 else \
                "invalid_request_error"
            status = response.status_code if response.status_code >= 400 else 502
            return EngineReply(status, error_body(f"engine answered a non-JSON body: {text}", type_=kind))
        return EngineReply(response.status_code, parsed)

    async def aclose(self) -> None:
        await self._client.aclose()
