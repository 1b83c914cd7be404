"""A dry run's ``openrelay.estimate`` (``"dry_run": true`` on a create, docs/api-contract.md §3 step 8; the answer
around it is the create's, ``service/create.py``): the records the create would accept, read once more, their
input tokens, worst cases (``engines.worst_case``), cost range and reusable prefix. Nothing is created or stored.
Each field and how it is counted: docs/progress-and-dry-run.md, "The estimate"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..catalog import Catalog
from ..engines.worst_case import worst_case
from ..validation.scan import Blocks, ScanResult

__all__ = ["MOST_COUNTED", "estimate"]

_BYTES_PER_TOKEN = 4  # the approximate rule's (engines.counting)
MOST_COUNTED = 2**63 - 1  # what a sum past the 64-bit integers of JSON and the store reads as

_decode = msgspec.json.Decoder().decode


def estimate(catalog: Catalog, *, source: Callable[[], Blocks], result: ScanResult, endpoint: str,
             priority: str) -> dict[str, Any]:
    """``openrelay.estimate`` of the records ``result`` accepted, read again from ``source``."""
    spec = catalog.models.get(result.model or "")
    found: dict[str, Any] = {"input_tokens": 0, "max_input_tokens": 0, "max_output_tokens": 0, "min_cost_nano_usd": 0,
             "max_cost_nano_usd": 0, "tokens_counted": "exact", "reusable_prefix_tokens": 0,
             "reusable_prefix_counted": "approximate"}
    if spec is None:
        return found
    if result.prefixes is not None and spec.prefix_grouping and result.prefixes.may_share():
        order = result.prefixes.order(rejected=(r.line for r in result.rejections))
        found["reusable_prefix_tokens"] = order.reusable_bytes() // _BYTES_PER_TOKEN
    price = spec.price(catalog.factor(priority))
    rejected = {r.line for r in result.rejections}
    exact = True
    for block in source():
        for offset, raw in enumerate(block.lines):
            line = block.first + offset
            if not raw or raw.isspace() or line in rejected:
                continue
            worst = worst_case(spec, endpoint, _decode(raw)["body"])
            exact = exact and worst.counted.exact and worst.calls == 1
            found["input_tokens"] += worst.counted.tokens
            found["max_input_tokens"] += worst.input_tokens
            found["max_output_tokens"] += worst.output_tokens
            found["min_cost_nano_usd"] += price.cost(worst.counted.tokens, 0)
            found["max_cost_nano_usd"] += price.cost(worst.input_tokens, worst.output_tokens)
    found["tokens_counted"] = "exact" if exact else "approximate"
    for name, value in found.items():  # a record may ask for any max_tokens; JSON and the store count in 64 bits
        if isinstance(value, int) and value > MOST_COUNTED:
            found[name] = MOST_COUNTED
    return found
