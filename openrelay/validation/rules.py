"""The per-record rules of a create (docs/api-contract.md §4), in the order they are checked, written once: they
see nothing but the fields of ``records.Record``. ``duplicate_custom_id`` and ``model_mismatch`` need the whole
input: ``scan`` applies them at its end."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from ..catalog import Catalog
from .records import UNSET, Body, ParseFailure, Record
from .tool_config import tool_config_problem

__all__ = ["Verdict", "check_record", "cut_custom_id", "WORKFLOW"]

CUSTOM_ID_LIMIT = 512  # bytes of the JSON-escaped custom_id shown back to the user
# The one rule a single record breaks for the whole input: a batch does not run ``openrelay.workflow`` (in
# ``body.openrelay`` or a top-level ``openrelay``), so the create is refused and nothing is made (§3).
WORKFLOW = "workflow_unsupported"
# (custom_id, "" when the record names none; code, None when it passes every single-record rule; message; model)
Verdict = tuple[str, str | None, str | None, str | None]


def check_record(record: Any, endpoint: str, catalog: Catalog) -> Verdict:
    """Judge one record as ``records.read_record`` read it (a ``Record``, the JSON value of a line that holds no
    object, or the ParseFailure of one that holds no JSON) on every rule that needs nothing but the record."""
    if not isinstance(record, Record):
        return _fail("", "invalid_json", str(record) if isinstance(record, ParseFailure)
                     else "record is not a JSON object")
    body = record.body
    if ((ext := getattr(body, "openrelay", UNSET)) is not UNSET or record.openrelay is not UNSET) and any(
            isinstance(e, dict) and "workflow" in e for e in (record.openrelay, ext)):
        return _fail("", WORKFLOW, "openrelay.workflow is not supported in batch; nothing was created")
    custom_id = record.custom_id
    if not isinstance(custom_id, str) or not custom_id:
        return _fail("", "missing_custom_id", "custom_id is required and must be a non-empty string")
    if record.method != "POST":
        return _fail(custom_id, "invalid_method", f'method must be "POST" (got {_show(record.method)})')
    if record.url != endpoint:
        return _fail(custom_id, "url_mismatch",
                     f'url {_show(record.url)} does not match the batch endpoint "{endpoint}"')
    if not isinstance(body, Body):
        return _fail(custom_id, "invalid_body", "body is required and must be a JSON object")
    if body.stream is True:
        return _fail(custom_id, "streaming_unsupported", '"stream": true is not supported in batch')
    if body.tool_config is not UNSET or record.tool_config is not UNSET:
        return _fail(custom_id, "tool_config_moved",
                     "tool_config has moved: put it under body.openrelay.tool_config")
    if body.openrelay is not UNSET:
        problem = _extension_problem(body.openrelay, catalog, endpoint)
        if problem is not None:
            return _fail(custom_id, *problem)
    model = body.model
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
    return custom_id, None, None, model


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
    return custom_id, code, message, None


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
    if value is None or value is UNSET:
        return "none"
    try:
        return orjson.dumps(value).decode()[:100]
    except orjson.JSONEncodeError:  # nested past orjson's 254 levels, or an integer past 64 bits
        pass
    try:
        return msgspec.json.encode(value).decode()[:100]
    except (msgspec.EncodeError, RecursionError, TypeError, ValueError):  # nested past msgspec's depth too
        return "a deeply nested JSON " + ("array" if isinstance(value, list) else "object")
