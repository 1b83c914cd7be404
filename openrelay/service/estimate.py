"""A dry run's ``openrelay.estimate`` (``"dry_run": true`` on a create, docs/api-contract.md §3 step 8; the answer
around it is the create's, ``service/create.py``): the records the create would accept, read once more, their
input tokens (``engines.counting``), output limits, cost range and reusable prefix. Nothing is created or stored.
Each field and how it is counted: docs/progress-and-dry-run.md, "The estimate"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..catalog import Catalog, ModelSpec
from ..engines.counting import counter_for
from ..validation.scan import Blocks, ScanResult

__all__ = ["DEFAULT_MAX_TOKENS", "MOST_COUNTED", "default_max_tokens", "output_limit", "estimate"]

DEFAULT_MAX_TOKENS = 4096  # a model's most output tokens per record when neither the record nor the catalog says
_LLAMA_MAX_TOKENS = 256  # engines/llama_local.py's default for an engine without max_tokens
_LLAMA_N_CTX = 2048
_BYTES_PER_TOKEN = 4  # the approximate rule's (engines.counting)
MOST_COUNTED = 2**63 - 1  # what a sum past the 64-bit integers of JSON and the store reads as

_decode = msgspec.json.Decoder().decode


def default_max_tokens(spec: ModelSpec) -> int:
    if spec.default_max_tokens is not None:
        return spec.default_max_tokens
    if spec.engine.get("kind") == "llama-cpp":
        return int(spec.engine.get("max_tokens", _LLAMA_MAX_TOKENS))
    return DEFAULT_MAX_TOKENS


def output_limit(endpoint: str, body: dict[str, Any], spec: ModelSpec) -> int:
    """The most output tokens the record allows."""
    if endpoint == "/v1/embeddings":
        return 0
    names = ("max_output_tokens",) if endpoint == "/v1/responses" else ("max_completion_tokens", "max_tokens")
    for name in names:
        value = body.get(name)
        if type(value) is int and value > 0:
            return value
    return default_max_tokens(spec)


def estimate(catalog: Catalog, *, source: Callable[[], Blocks], result: ScanResult, endpoint: str,
             priority: str) -> dict[str, Any]:
    """``openrelay.estimate`` of the records ``result`` accepted, read again from ``source``."""
    spec = catalog.models.get(result.model or "")
    found = {"input_tokens": 0, "max_output_tokens": 0, "min_cost_nano_usd": 0, "max_cost_nano_usd": 0,
             "tokens_counted": "exact", "reusable_prefix_tokens": 0, "reusable_prefix_counted": "approximate"}
    if spec is None:
        return found
    if result.prefixes is not None and spec.prefix_grouping and result.prefixes.may_share():
        order = result.prefixes.order(rejected=(r.line for r in result.rejections))
        found["reusable_prefix_tokens"] = order.reusable_bytes() // _BYTES_PER_TOKEN
    counter = counter_for(spec)
    price = spec.price(catalog.factor(priority))
    n_ctx = int(spec.engine.get("n_ctx", _LLAMA_N_CTX)) if spec.engine.get("kind") == "llama-cpp" else None
    rejected = {r.line for r in result.rejections}
    exact = True
    for block in source():
        for offset, raw in enumerate(block.lines):
            line = block.first + offset
            if not raw or raw.isspace() or line in rejected:
                continue
            body = dict(_decode(raw)["body"])
            extension = body.pop("openrelay", None)
            counted = counter.count(endpoint, body)
            limit = output_limit(endpoint, body, spec)
            if n_ctx is not None:
                limit = max(0, min(limit, n_ctx - counted.tokens))
            exact = exact and counted.exact and not (isinstance(extension, dict) and "tool_config" in extension)
            found["input_tokens"] += counted.tokens
            found["max_output_tokens"] += limit
            found["min_cost_nano_usd"] += price.cost(counted.tokens, 0)
            found["max_cost_nano_usd"] += price.cost(counted.tokens, limit)
    found["tokens_counted"] = "exact" if exact else "approximate"
    for name, value in found.items():  # a record may ask for any max_tokens; JSON and the store count in 64 bits
        if isinstance(value, int) and value > MOST_COUNTED:
            found[name] = MOST_COUNTED
    return found
