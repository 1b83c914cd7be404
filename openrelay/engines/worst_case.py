"""A record's worst case: the most input and output tokens it can be billed for, known before it runs. A dry run
prices it (``max_cost_nano_usd``), a hard budget reserves it, and a worker holds what it bills to it
(``worker/billing.py``). Why each part is a bound: docs/progress-and-dry-run.md, "The estimate"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..catalog import ModelSpec
from ..validation.tool_config import DEFAULT_MAX_ROUNDS
from .counting import Count, counter_for

__all__ = ["DEFAULT_MAX_TOKENS", "COUNTED_IN_PROCESS", "WorstCase", "default_max_tokens", "output_limit", "worst_case"]

COUNTED_IN_PROCESS = ("llama-cpp", "onnx-embeddings", "rapidocr")  # kinds whose exact count blocks: off the loop
DEFAULT_MAX_TOKENS = 4096  # a model's most output tokens per record when neither the record nor the catalog says
TEMPLATE_TOKENS = 256  # what a chat template may add: special tokens, a default system prompt, tool instructions
MEDIA_TOKENS = 16_384  # an image, audio or file part: Qwen2-VL's most tokens per image, the largest we know
_MEDIA_PARTS = tuple(b'"type":"%s"' % kind for kind in (b"image_url", b"input_image", b"input_audio", b"input_file",
                                                         b"file", b"video_url"))
_LLAMA_MAX_TOKENS = 256  # engines/llama_chat.py's default for an engine without max_tokens
_LLAMA_N_CTX = 2048


@dataclass(frozen=True, slots=True)
class WorstCase:
    counted: Count  # the input as its engine is expected to count it (the estimate's ``input_tokens``)
    input_tokens: int  # the most input tokens it may be billed for
    output_tokens: int  # the most output tokens
    calls: int  # model calls: 1, or a tool loop's max_rounds + 1 (both bounds above count them all)


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


def worst_case(spec: ModelSpec, endpoint: str, body: dict[str, Any]) -> WorstCase:
    """``body`` is the record's, ``openrelay`` extension included. Input: the engine's own count where it is exact
    (``engines.counting``), else a token per byte of the body as JSON, plus a template's overhead and a fixed
    allowance per media part. Output: the record's limit."""
    extension = body.get("openrelay")
    sent = {k: v for k, v in body.items() if k != "openrelay"}
    counted = counter_for(spec).count(endpoint, sent)
    tokens = counted.tokens
    if not counted.exact:  # JSON without spaces: a part's "type" reads so only as a key, never inside a text
        encoded = msgspec.json.encode(sent)
        tokens = len(encoded) + TEMPLATE_TOKENS + MEDIA_TOKENS * sum(map(encoded.count, _MEDIA_PARTS))
    limit = output_limit(endpoint, sent, spec)
    if spec.engine.get("kind") == "llama-cpp" and counted.exact:  # its server stops where the context is full
        limit = max(0, min(limit, int(spec.engine.get("n_ctx", _LLAMA_N_CTX)) - counted.tokens))
    calls = 1
    if isinstance(extension, dict) and isinstance(extension.get("tool_config"), dict):
        rounds = extension["tool_config"].get("max_rounds", DEFAULT_MAX_ROUNDS)
        calls = (rounds if type(rounds) is int and rounds > 0 else DEFAULT_MAX_ROUNDS) + 1
    return WorstCase(counted=counted, input_tokens=tokens * calls, output_tokens=limit * calls, calls=calls)

