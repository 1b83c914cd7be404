"""What an engine's answer is billed for: the token counts of its ``usage``, read by endpoint (chat and text
completions, Responses, embeddings, Anthropic's Messages; the fields: docs/engines.md and docs/api-contract.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalog import MESSAGES

__all__ = ["RecordUsage", "record_usage"]


@dataclass(frozen=True, kw_only=True)
class RecordUsage:
    """One answer's token counts. The details are parts of their totals: ``cached_tokens`` of ``input_tokens``,
    ``reasoning_tokens`` of ``output_tokens``."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class _Fields:
    """Where an endpoint's answer keeps each count: (field) or (details object, field) inside ``usage``."""

    input: str
    output: str
    cached: tuple[str, str] | None
    reasoning: tuple[str, str] | None


_CHAT = _Fields("prompt_tokens", "completion_tokens", ("prompt_tokens_details", "cached_tokens"),
                ("completion_tokens_details", "reasoning_tokens"))  # chat and text completions
_FIELDS = {
    "/v1/responses": _Fields("input_tokens", "output_tokens", ("input_tokens_details", "cached_tokens"),
                             ("output_tokens_details", "reasoning_tokens")),
    "/v1/embeddings": _Fields("prompt_tokens", "completion_tokens", None, None),
}


def record_usage(endpoint: str, body: dict[str, Any]) -> RecordUsage:
    """The counts an answer on ``endpoint`` is billed for: what its ``usage`` says, 0 for a count that is missing
    or not a non-negative integer; a detail never counts more than its total."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return RecordUsage()
    if endpoint == MESSAGES:
        cached = _tokens(usage, "cache_read_input_tokens")
        return RecordUsage(input_tokens=_tokens(usage, "input_tokens") + cached
                           + _tokens(usage, "cache_creation_input_tokens"),
                           cached_tokens=cached, output_tokens=_tokens(usage, "output_tokens"))
    fields = _FIELDS.get(endpoint, _CHAT)
    input_tokens, output_tokens = _tokens(usage, fields.input), _tokens(usage, fields.output)
    return RecordUsage(input_tokens=input_tokens, cached_tokens=min(_detail(usage, fields.cached), input_tokens),
                       output_tokens=output_tokens,
                       reasoning_tokens=min(_detail(usage, fields.reasoning), output_tokens))


def _detail(usage: dict[str, Any], where: tuple[str, str] | None) -> int:
    if where is None:
        return 0
    details = usage.get(where[0])
    return _tokens(details, where[1]) if isinstance(details, dict) else 0


def _tokens(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    # bool is an int to Python, never a count to an engine
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
