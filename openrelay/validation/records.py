"""The per-record rules of a create (CONTRACT section 4), in the order they are checked.

``check_record`` decides everything a record can be judged on alone. The two rules that need the whole input,
``duplicate_custom_id`` and ``model_mismatch``, are settled by ``scan`` once every record has been read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from ..catalog import Catalog
from .gojson import unmarshal_error_message
from .tool_config import tool_config_problem

__all__ = ["Verdict", "parse_line", "check_record", "carries_workflow", "cut_custom_id", "ParseFailure", "MAX_DEPTH"]

CUSTOM_ID_LIMIT = 512  # bytes of the JSON-escaped custom_id shown back to the user
MAX_DEPTH = 1024  # orjson's nesting limit: a record nested deeper is refused in Go's words for its own limit


@dataclass(frozen=True, slots=True)
class Verdict:
    custom_id: str  # "" when the record names none
    code: str | None  # None: passes every single-record rule
    message: str | None
    model: str | None


class ParseFailure(Exception):
    """The line is not a JSON object; ``str(exc)`` is the message shown to the user."""


def parse_line(raw: bytes) -> Any:
    """The record on one line; ParseFailure with the message Go's decoder gives when it is not JSON we can run.

    orjson reads nearly every line. What it refuses is refused with Go's message: a syntax error, nesting past
    ``MAX_DEPTH``, or a number outside the float range (``1e400``: no engine could be sent it). An integer too
    long for a float64 is no error (integers keep every digit): msgspec reads it exactly.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseFailure(f"invalid UTF-8 at byte {exc.start}") from None
    message = unmarshal_error_message(raw, MAX_DEPTH)
    if message is not None:
        raise ParseFailure(message) from None
    try:
        return _exact_decode(raw)
    except (msgspec.DecodeError, RecursionError):  # e.g. a lone UTF-16 surrogate escape
        raise ParseFailure("invalid JSON") from None


_exact_decode = msgspec.json.Decoder().decode


def carries_workflow(record: Any) -> bool:
    """Whether the record asks for ``openrelay.workflow`` (in ``body.openrelay`` or a top-level ``openrelay``)."""
    if not isinstance(record, dict):
        return False
    top = record.get("openrelay")
    if isinstance(top, dict) and "workflow" in top:
        return True
    body = record.get("body")
    if isinstance(body, dict):
        ext = body.get("openrelay")
        return isinstance(ext, dict) and "workflow" in ext
    return False


def cut_custom_id(custom_id: str) -> str:
    """The custom_id as shown in rejections: at most 512 escaped bytes, else a 509-byte prefix and ``...``."""
    if len(custom_id) * 6 <= CUSTOM_ID_LIMIT or _escaped_len(custom_id) <= CUSTOM_ID_LIMIT:
        return custom_id
    budget = CUSTOM_ID_LIMIT - 3
    used = 0
    for i, ch in enumerate(custom_id):
        used += _escaped_len(ch)
        if used > budget:
            return custom_id[:i] + "..."
    return custom_id


def _escaped_len(text: str) -> int:
    return len(orjson.dumps(text)) - 2


def _fail(custom_id: str, code: str, message: str) -> Verdict:
    return Verdict(custom_id=custom_id, code=code, message=message, model=None)


def check_record(record: Any, *, endpoint: str, catalog: Catalog) -> Verdict:
    """Judge one parsed record on every rule that needs nothing but the record itself."""
    if not isinstance(record, dict):
        return _fail("", "invalid_json", "record is not a JSON object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _fail("", "missing_custom_id", "custom_id is required and must be a non-empty string")
    method = record.get("method")
    if method != "POST":
        return _fail(custom_id, "invalid_method", f'method must be "POST" (got {_show(method)})')
    url = record.get("url")
    if url != endpoint:
        return _fail(custom_id, "url_mismatch", f'url {_show(url)} does not match the batch endpoint "{endpoint}"')
    body = record.get("body")
    if not isinstance(body, dict):
        return _fail(custom_id, "invalid_body", "body is required and must be a JSON object")
    if body.get("stream") is True:
        return _fail(custom_id, "streaming_unsupported", '"stream": true is not supported in batch')
    if "tool_config" in body or "tool_config" in record:
        return _fail(custom_id, "tool_config_moved",
                     "tool_config has moved: put it under body.openrelay.tool_config")
    if "openrelay" in body:
        problem = _extension_problem(body["openrelay"], catalog, endpoint)
        if problem is not None:
            return _fail(custom_id, *problem)
    model = body.get("model")
    if not isinstance(model, str):
        return _fail(custom_id, "missing_model", "body.model is required and must be a string")
    spec = catalog.models.get(model)
    if spec is None:
        offered = ", ".join(catalog.names())
        return _fail(custom_id, "model_not_offered",
                     f'model "{model}" is not offered for batch (offered: {offered})')
    if endpoint not in spec.endpoints:
        return _fail(custom_id, "model_endpoint_mismatch",
                     f'model "{model}" is not offered for {endpoint} (it serves: {", ".join(spec.endpoints)})')
    return Verdict(custom_id=custom_id, code=None, message=None, model=model)


def _extension_problem(ext: Any, catalog: Catalog, endpoint: str) -> tuple[str, str] | None:
    if not isinstance(ext, dict):
        return "unknown_extension", "body.openrelay must be a JSON object"
    unknown = sorted(k for k in ext if k != "tool_config")
    if unknown:
        return "unknown_extension", f'unknown openrelay extension "{unknown[0]}" (supported: tool_config)'
    if "tool_config" in ext:
        problem = tool_config_problem(ext["tool_config"], catalog, endpoint)
        if problem is not None:
            return "invalid_tool_config", problem
    return None


def _show(value: Any) -> str:
    """``value`` as JSON, cut to 100 characters, for a message."""
    if value is None:
        return "none"
    try:
        return orjson.dumps(value).decode()[:100]
    except orjson.JSONEncodeError:  # nested past orjson's 254 levels, or an integer past 64 bits
        pass
    try:
        return msgspec.json.encode(value).decode()[:100]
    except (msgspec.EncodeError, RecursionError, TypeError, ValueError):  # nested past msgspec's depth too
        return "a deeply nested JSON " + ("array" if isinstance(value, list) else "object")
