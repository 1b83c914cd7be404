"""An engine's own load, as its Prometheus metrics say: the catalog's ``load_metrics``, ``metrics_url`` and
``yield_to_interactive`` knobs checked, and one replica's requests running and waiting read (``MetricsReader``)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import PyreqwestError

__all__ = ["DIALECTS", "Load", "MetricsReader", "UnreadableLoad", "check_load_knobs", "metrics_urls", "parse_load"]

# Per dialect: the gauges of requests running and waiting on the engine, and of its KV cache's use (0 to 1).
DIALECTS = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", None),
    "llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred", None),
}

Load = tuple[int, int, "float | None"]  # (requests running, requests waiting, KV cache use or None)


class UnreadableLoad(ValueError):
    """The metrics could not be read: no answer, an error status, a dialect's gauge missing or not a count."""


def parse_load(dialect: str, text: str) -> Load:
    """The load in Prometheus text; the samples of one name (an engine per GPU group, a model per label) are
    summed."""
    names = [name for name in DIALECTS[dialect] if name is not None]
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            value = line[line.rindex("}") + 1:] if "}" in line else line[len(name):]
            try:
                number = float(value.split()[0])
            except (ValueError, IndexError):
                raise UnreadableLoad(f"{name} is not a number: {line[:200]!r}") from None
            if not math.isfinite(number) or number < 0:
                raise UnreadableLoad(f"{name} is not a count: {line[:200]!r}")
            sums[name] = sums.get(name, 0.0) + number
    running, waiting, kv = DIALECTS[dialect]
    missing = [name for name in (running, waiting) if name not in sums]
    if missing:
        raise UnreadableLoad(f"no {' or '.join(missing)} in the metrics")
    return round(sums[running]), round(sums[waiting]), sums.get(kv) if kv else None


def metrics_urls(config: dict[str, Any], base_urls: list[str]) -> list[str]:
    """Each replica's metrics URL: ``metrics_url`` (a list of one per ``base_urls`` entry), else the base URL's
    origin + ``/metrics``."""
    given = config.get("metrics_url")
    if given is not None:
        return [given] if isinstance(given, str) else list(given)
    return [f"{urlsplit(url).scheme}://{urlsplit(url).netloc}/metrics" for url in base_urls]


def check_load_knobs(config: dict[str, Any], base_urls: list[str]) -> None:
    """Raise ``ValueError`` for knobs of an ``openai`` engine that cannot be used."""
    dialect = config.get("load_metrics")
    if dialect is None:
        if "metrics_url" in config or "yield_to_interactive" in config:
            raise ValueError("takes metrics_url and yield_to_interactive only with load_metrics")
    elif dialect not in DIALECTS:
        raise ValueError(f"needs load_metrics to be one of {', '.join(map(repr, DIALECTS))} (got {dialect!r})")
    else:
        given = config.get("metrics_url")
        many = "base_urls" in config
        if given is not None and (isinstance(given, str) == many or (many and len(given) != len(base_urls))):
            raise ValueError("needs metrics_url to be one URL with base_url, a list of one per entry with base_urls")
        for url in metrics_urls(config, base_urls):
            if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
                raise ValueError(f"needs metrics_url to be an http(s) URL (got {url!r})")
        if type(config.get("yield_to_interactive", True)) is not bool:
            raise ValueError("needs yield_to_interactive to be true or false")
    if "engine_priority" in config and type(config["engine_priority"]) is not int:
        raise ValueError("needs engine_priority to be an integer")


class MetricsReader:
    """GETs one replica's metrics; ``headers`` are the engine's own (its API key)."""

    def __init__(self, url: str, dialect: str, headers: dict[str, str], timeout: float) -> None:
        self.url = url
        self.dialect = dialect
        self._headers = headers
        self._timeout = timedelta(seconds=timeout)
        self._client: Client | None = None

    async def read(self) -> Load:
        if self._client is None:
            self._client = (ClientBuilder().timeout(self._timeout).default_headers(self._headers).no_proxy()
                            .follow_redirects(False).build())
        try:
            response = await self._client.get(self.url).build().send()
            status, content = response.status, (await response.bytes()).to_bytes()
        except (PyreqwestError, OSError) as exc:
            raise UnreadableLoad(f"no answer: {exc.__class__.__name__}: {exc}") from exc
        if status != 200:
            raise UnreadableLoad(f"HTTP {status}")
        return parse_load(self.dialect, content.decode("utf-8", "replace"))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
