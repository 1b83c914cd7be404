"""The catalog: which models are offered, on which endpoints, at what price, served by which engine."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import CatalogError

__all__ = ["ENDPOINTS", "Catalog", "ModelSpec", "TokenPrice", "ToolLimits", "load_catalog", "parse_catalog"]

ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions")
_NANO_PER_USD_PER_MTOK = Decimal(1000)  # 1 USD per Mtok = 1,000 nano-USD per token


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """A model's rates at one tier as exact integers over ``scale``: costing a record is integer arithmetic."""

    input_scaled: int
    output_scaled: int
    scale: int

    def cost(self, prompt_tokens: int, completion_tokens: int) -> int:
        """nano-USD, rounded half to even."""
        whole, rest = divmod(prompt_tokens * self.input_scaled + completion_tokens * self.output_scaled, self.scale)
        if 2 * rest > self.scale or (2 * rest == self.scale and whole % 2):
            whole += 1
        return whole


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    endpoints: tuple[str, ...]
    slots: int
    concurrency: int
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    engine: dict[str, Any]

    def price(self, factor: Decimal) -> TokenPrice:
        rates = [rate * _NANO_PER_USD_PER_MTOK * factor for rate in (self.input_usd_per_mtok, self.output_usd_per_mtok)]
        exponent = min(0, *(int(r.as_tuple().exponent) for r in rates))
        scale = 10 ** -exponent
        return TokenPrice(int(rates[0] * scale), int(rates[1] * scale), scale)


@dataclass(frozen=True, kw_only=True)
class ToolLimits:
    """How far a record's tool loop may lean on tool servers (``[tools]`` in the catalog)."""

    call_timeout_seconds: float = 60.0  # one tool call; past it the model is told the call timed out
    record_timeout_seconds: float = 300.0  # all of one record's time in tool servers; past it the record fails
    max_output_bytes: int = 65_536  # of one tool result, as fed back to the model


@dataclass(frozen=True, kw_only=True)
class Catalog:
    models: dict[str, ModelSpec]
    pricing: dict[str, Decimal]
    tools_allow: tuple[str, ...] = field(default_factory=tuple)
    tool_limits: ToolLimits = field(default_factory=ToolLimits)

    def names(self) -> list[str]:
        return sorted(self.models)

    def factor(self, priority: str) -> Decimal:
        return self.pricing[priority]

    def tool_url_allowed(self, url: str) -> bool:
        """Whether an allow entry covers ``url``: the same scheme, host and port, and the entry's path or a path
        under it (``/mcp`` covers ``/mcp`` and ``/mcp/x``, not ``/mcpx``; ``/`` covers every path).

        Compared parsed, not as strings: as a string prefix ``https://tools.example.com`` would also admit
        ``https://tools.example.com.evil.net/`` and ``https://tools.example.com:1@evil.net/``. A URL with
        userinfo, or with characters that URL parsers read differently (backslashes, spaces, controls, non-ASCII),
        is allowed by no entry."""
        target = _url_origin_path(url)
        return target is not None and any(
            entry is not None and target[0] == entry[0] and _under(target[1], entry[1])
            for entry in map(_url_origin_path, self.tools_allow))

    def as_api(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "endpoints": list(m.endpoints), "owned_by": "openrelay"}
            for m in sorted(self.models.values(), key=lambda m: m.name)
        ]}


@functools.lru_cache(maxsize=1024)  # a create checks every record's servers against every entry
def _url_origin_path(url: str) -> tuple[tuple[str, str, int], str] | None:
    """``((scheme, host, port), path)`` of an http(s) URL, the host lower-cased and the port made explicit; None
    for anything else, or for a URL that names userinfo or has characters outside printable ASCII or ``\\``."""
    if not url.isascii() or not url.isprintable() or " " in url or "\\" in url:
        return None
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return (parts.scheme, parts.hostname, port), parts.path or "/"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")


def _model(raw: dict[str, Any]) -> ModelSpec:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise CatalogError("catalog: every [[models]] needs a name")
    endpoints = tuple(raw.get("endpoints") or ("/v1/chat/completions",))
    for ep in endpoints:
        if ep not in ENDPOINTS:
            raise CatalogError(f"catalog: model {name!r} names unsupported endpoint {ep!r}")
    engine = raw.get("engine")
    if not isinstance(engine, dict) or "kind" not in engine:
        raise CatalogError(f"catalog: model {name!r} needs engine = {{ kind = ... }}")
    slots, concurrency = int(raw.get("slots", 1)), int(raw.get("concurrency", 8))
    if slots < 1 or concurrency < 1:
        raise CatalogError(f"catalog: model {name!r} needs slots and concurrency >= 1")
    return ModelSpec(
        name=name,
        endpoints=endpoints,
        slots=slots,
        concurrency=concurrency,
        input_usd_per_mtok=Decimal(str(raw.get("input_usd_per_mtok", 0))),
        output_usd_per_mtok=Decimal(str(raw.get("output_usd_per_mtok", 0))),
        engine=dict(engine),
    )


def parse_catalog(text: str) -> Catalog:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"catalog: {exc}") from exc
    pricing = {"standard": Decimal("0.5"), "expedited": Decimal("0.75")}
    pricing.update({k: Decimal(str(v)) for k, v in (raw.get("pricing") or {}).items()})
    try:
        models = [_model(m) for m in raw.get("models", [])]
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:  # a field of the wrong type
        raise CatalogError(f"catalog: a [[models]] entry has a field of the wrong type: {exc}") from exc
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise CatalogError(f"catalog: a model name appears twice: {sorted(n for n in names if names.count(n) > 1)[0]}")
    tools = raw.get("tools") or {}
    for entry in tools.get("allow", ()):
        if not isinstance(entry, str) or _url_origin_path(entry) is None:
            raise CatalogError(f"catalog: [tools] allow entry {entry!r} is not an http(s) URL without userinfo")
    return Catalog(models={m.name: m for m in models}, pricing=pricing, tools_allow=tuple(tools.get("allow", ())),
                   tool_limits=_tool_limits(tools))


def _tool_limits(tools: dict[str, Any]) -> ToolLimits:
    defaults = ToolLimits()
    limits = ToolLimits(
        call_timeout_seconds=float(tools.get("call_timeout_seconds", defaults.call_timeout_seconds)),
        record_timeout_seconds=float(tools.get("record_timeout_seconds", defaults.record_timeout_seconds)),
        max_output_bytes=int(tools.get("max_output_bytes", defaults.max_output_bytes)),
    )
    if min(limits.call_timeout_seconds, limits.record_timeout_seconds, limits.max_output_bytes) <= 0:
        raise CatalogError("catalog: [tools] timeouts and max_output_bytes must be positive")
    return limits


def load_catalog(path: Path | None) -> Catalog:
    """The catalog at ``path``, or the built-in one of local CPU models."""
    if path is None:
        text = resources.files("openrelay").joinpath("builtin_catalog.toml").read_text()
    else:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogError(f"catalog: cannot read {path}: {exc}") from exc
    return parse_catalog(text)
