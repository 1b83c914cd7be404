"""The catalog: which models are offered, on which endpoints, at what price, served by which engine."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import CatalogError
from .urls import HttpUrl, UrlRefused, normalized_http_url

__all__ = ["ENDPOINTS", "CHAT", "MESSAGES", "Catalog", "ModelSpec", "TokenPrice", "ToolLimits", "load_catalog",
           "parse_catalog"]

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"  # Anthropic's Messages API: every chat model serves it, translated unless listed
ENDPOINTS = (CHAT, "/v1/embeddings", "/v1/completions", "/v1/responses", MESSAGES)
_NANO_PER_USD_PER_MTOK = Decimal(1000)  # 1 USD per Mtok = 1,000 nano-USD per token


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """A model's rates at one tier as exact integers over ``scale``: costing a record is integer arithmetic."""

    input_scaled: int
    output_scaled: int
    scale: int
    cached_scaled: int | None = None  # cached input tokens' rate; None: the input rate

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> int:
        """nano-USD, rounded half to even. ``cached_tokens`` (at most ``prompt_tokens``) of the prompt are billed
        at the cached rate, the rest at the input rate."""
        cached = max(0, min(cached_tokens, prompt_tokens)) if self.cached_scaled is not None else 0
        cached_rate = self.cached_scaled if self.cached_scaled is not None else self.input_scaled
        scaled = ((prompt_tokens - cached) * self.input_scaled + cached * cached_rate
                  + completion_tokens * self.output_scaled)
        whole, rest = divmod(scaled, self.scale)
        if 2 * rest > self.scale or (2 * rest == self.scale and whole % 2):
            whole += 1
        return whole


DEFAULT_CONCURRENCY = 8  # requests in flight per running batch when the catalog says nothing
DEFAULT_MIN_CONCURRENCY = 1  # bounds of concurrency = "auto"
DEFAULT_MAX_CONCURRENCY = 256


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    endpoints: tuple[str, ...]
    slots: int
    # Requests in flight per running batch; with ``adaptive`` (concurrency = "auto") the most one batch may have,
    # ``max_concurrency``, while a limiter per engine replica (worker/limiter.py) sets how many are sent.
    concurrency: int
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    engine: dict[str, Any]
    # The most tokens a record's answer may have when the record sets no max_tokens (a dry run's estimate);
    # None: a llama-cpp engine's own max_tokens, else engines/worst_case.py's DEFAULT_MAX_TOKENS.
    default_max_tokens: int | None = None
    adaptive: bool = False
    min_concurrency: int = DEFAULT_MIN_CONCURRENCY
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    cached_input_usd_per_mtok: Decimal | None = None  # None: cached input tokens cost the input rate
    prefix_grouping: bool = True  # dispatch records that share a prompt prefix back to back (worker/dispatch.py)
    created: int = 0  # the model object's ``created`` (Unix seconds), as the catalog says; 0 when it does not
    # ``/v1/messages`` goes to the engine as it is (the catalog lists it: llama-server, vLLM), not translated to
    # chat completions (engines/messages_chat.py)
    speaks_messages: bool = False

    def price(self, factor: Decimal) -> TokenPrice:
        usd = [self.input_usd_per_mtok, self.output_usd_per_mtok]
        if self.cached_input_usd_per_mtok is not None:
            usd.append(self.cached_input_usd_per_mtok)
        rates = [rate * _NANO_PER_USD_PER_MTOK * factor for rate in usd]
        exponent = min(0, *(int(r.as_tuple().exponent) for r in rates))
        scale = 10 ** -exponent
        cached = int(rates[2] * scale) if len(rates) > 2 else None
        return TokenPrice(int(rates[0] * scale), int(rates[1] * scale), scale, cached)


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
    webhooks_allow: tuple[str, ...] = field(default_factory=tuple)  # webhook URLs that may reach private addresses

    def names(self) -> list[str]:
        return sorted(self.models)

    def factor(self, priority: str) -> Decimal:
        return self.pricing[priority]

    def tool_url_allowed(self, url: str) -> bool:
        return self.allowed_tool_url(url) is not None

    def allowed_tool_url(self, url: str) -> str | None:
        """The URL to connect to for ``url`` when an allow entry covers it, else None: ``url`` normalized
        (``openrelay.urls``: dot segments, also percent-encoded ones, and empty segments resolved), with the same
        scheme, host and port as the entry, and the entry's path or a path under it (``/mcp`` covers ``/mcp`` and
        ``/mcp/x``, not ``/mcpx``; ``/`` covers every path).

        Compared parsed and normalized, not as strings: as a string prefix ``https://tools.example.com`` would
        also admit ``https://tools.example.com.evil.net/`` and ``https://tools.example.com:1@evil.net/``, and
        ``https://tools.example.com/mcp/../admin`` would pass for a path under ``/mcp``. A URL with userinfo, or
        with a shape servers read in more than one way (an encoded slash, backslashes, spaces, controls,
        non-ASCII), is allowed by no entry. Connecting to the URL returned is what makes the check hold: the
        server is asked for exactly the path that was compared."""
        return _covered(url, self.tools_allow)

    def webhook_private_allowed(self, url: str) -> bool:
        """Whether a webhook endpoint at ``url`` may be delivered to a loopback or private address: an entry of
        ``[webhooks] allow`` covers it, matched as ``[tools] allow`` is (``allowed_tool_url``). Link-local and
        metadata addresses are refused whatever it says (``webhooks/network.py``)."""
        return _covered(url, self.webhooks_allow) is not None

    def as_api(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_object(name) for name in sorted(self.models)]}

    def model_object(self, name: str) -> dict[str, Any]:
        """The model ``name`` as OpenAI's model object, with the endpoints it serves (KeyError: not offered)."""
        model = self.models[name]
        return {"id": model.name, "object": "model", "created": model.created, "owned_by": "openrelay",
                "endpoints": list(model.endpoints)}


def _covered(url: str, entries: tuple[str, ...]) -> str | None:
    """``url`` normalized when an entry covers it, else None."""
    try:
        target = normalized_http_url(url)
    except UrlRefused:
        return None
    allowed = any(entry is not None and entry.covers(target) for entry in map(_allow_entry, entries))
    return target.url if allowed else None


def _allow_entry(entry: str) -> HttpUrl | None:
    try:
        return normalized_http_url(entry)
    except UrlRefused:  # parse_catalog refuses such an entry; a Catalog made otherwise may still hold one
        return None


def _model(raw: dict[str, Any]) -> ModelSpec:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise CatalogError("catalog: every [[models]] needs a name")
    endpoints = tuple(raw.get("endpoints") or (CHAT,))
    for ep in endpoints:
        if ep not in ENDPOINTS:
            raise CatalogError(f"catalog: model {name!r} names unsupported endpoint {ep!r}")
    speaks_messages = MESSAGES in endpoints
    if CHAT in endpoints and not speaks_messages:
        endpoints += (MESSAGES,)  # message batches of a chat model go to its engine as chat completions
    engine = raw.get("engine")
    if not isinstance(engine, dict) or "kind" not in engine:
        raise CatalogError(f"catalog: model {name!r} needs engine = {{ kind = ... }}")
    slots = int(raw.get("slots", 1))
    adaptive, concurrency, low, high = _concurrency(name, raw)
    if slots < 1:
        raise CatalogError(f"catalog: model {name!r} needs slots >= 1")
    default_max_tokens = raw.get("default_max_tokens")
    if default_max_tokens is not None and (type(default_max_tokens) is not int or default_max_tokens < 1):
        raise CatalogError(f"catalog: model {name!r} needs default_max_tokens to be a positive integer")
    grouping = raw.get("prefix_grouping", True)
    if type(grouping) is not bool:
        raise CatalogError(f"catalog: model {name!r} needs prefix_grouping to be true or false")
    created = raw.get("created", 0)
    if type(created) is not int or created < 0:
        raise CatalogError(f"catalog: model {name!r} needs created to be a Unix time in seconds (an integer >= 0)")
    cached = raw.get("cached_input_usd_per_mtok")
    return ModelSpec(
        name=name,
        endpoints=endpoints,
        slots=slots,
        concurrency=concurrency,
        input_usd_per_mtok=Decimal(str(raw.get("input_usd_per_mtok", 0))),
        output_usd_per_mtok=Decimal(str(raw.get("output_usd_per_mtok", 0))),
        engine=dict(engine),
        default_max_tokens=default_max_tokens,
        adaptive=adaptive,
        min_concurrency=low,
        max_concurrency=high,
        cached_input_usd_per_mtok=None if cached is None else Decimal(str(cached)),
        prefix_grouping=grouping,
        created=created,
        speaks_messages=speaks_messages,
    )


def _concurrency(name: str, raw: dict[str, Any]) -> tuple[bool, int, int, int]:
    """(adaptive, concurrency, min_concurrency, max_concurrency): an integer ``concurrency`` keeps its meaning
    (requests in flight per running batch); ``"auto"`` lets a limiter find it between the two bounds."""
    value = raw.get("concurrency", DEFAULT_CONCURRENCY)
    low = raw.get("min_concurrency", DEFAULT_MIN_CONCURRENCY)
    high = raw.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)
    if type(low) is not int or type(high) is not int or not 1 <= low <= high:
        raise CatalogError(f"catalog: model {name!r} needs 1 <= min_concurrency <= max_concurrency (integers)")
    if value == "auto":
        return True, high, low, high
    if type(value) is not int or value < 1:
        raise CatalogError(f'catalog: model {name!r} needs concurrency to be an integer >= 1 or "auto"')
    return False, value, low, high


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
    webhooks = raw.get("webhooks") or {}
    return Catalog(models={m.name: m for m in models}, pricing=pricing, tools_allow=_allow_list(tools, "tools"),
                   tool_limits=_tool_limits(tools), webhooks_allow=_allow_list(webhooks, "webhooks"))


def _allow_list(section: dict[str, Any], name: str) -> tuple[str, ...]:
    """``[tools] allow`` or ``[webhooks] allow``: http(s) URLs that ``openrelay.urls`` can normalize."""
    entries = section.get("allow", ())
    if not isinstance(entries, list | tuple):
        raise CatalogError(f"catalog: [{name}] allow must be a list of http(s) URLs")
    for entry in entries:
        if not isinstance(entry, str):
            raise CatalogError(f"catalog: [{name}] allow entry {entry!r} is not an http(s) URL without userinfo")
        try:
            normalized_http_url(entry)
        except UrlRefused as exc:
            raise CatalogError(f"catalog: [{name}] allow entry {entry!r} {exc}") from None
    return tuple(entries)


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
