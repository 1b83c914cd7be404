"""A create's body: decoded (each inline request kept as its own bytes), then its fields checked."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from ..catalog import ENDPOINTS
from ..errors import InvalidRequest
from ..types import Priority
from .bodies import unrecognized_argument

__all__ = ["WINDOWS", "CREATE_FIELDS", "UNSUPPORTED_FIELDS", "decode_create_body", "decode_fields",
           "check_create_fields", "check_metadata"]

WINDOWS = ("24h",)
# The top-level fields of a create; any other is refused by name (OpenAI's "Unrecognized request argument").
CREATE_FIELDS = ("input_file_id", "requests", "endpoint", "completion_window", "metadata", "priority", "dry_run",
                 "failure_threshold", "output_expires_after")
# Fields the OpenAI API documents that OpenRelay does not honor: refused with the reason, never ignored (none now).
UNSUPPORTED_FIELDS: dict[str, str] = {}

_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_requests = msgspec.json.Decoder(list[msgspec.Raw]).decode
_decode_value = msgspec.json.Decoder().decode


def decode_create_body(raw: bytes) -> dict[str, Any]:
    """The create's body: ``requests`` as the raw bytes of each request, every other known field decoded.

    Each request is judged (and stored) from its own bytes, exactly like a line of an input file: a request
    the parser refuses (``1e400``, say) is that request's ``invalid_json``, not the whole create's, and what
    the request holds reaches the engine as sent (big integers keep their digits, nesting stays as deep).
    An unknown field is kept undecoded: ``check_create_fields`` refuses it by name.
    """
    body: dict[str, Any] = {}
    for name, value in decode_fields(raw).items():
        if name == "requests":
            try:
                body[name] = _decode_requests(value)
            except (msgspec.DecodeError, RecursionError):
                body[name] = None  # not a list: check_create_fields says what requests must be
        elif name in CREATE_FIELDS:
            try:
                body[name] = _decode_value(value)
            except (msgspec.DecodeError, RecursionError) as exc:
                raise InvalidRequest(f"request body is not valid JSON: {name}: {_reason(exc)}",
                                     param=name) from None
        else:
            body[name] = value
    return body


def decode_fields(raw: bytes) -> dict[str, msgspec.Raw]:
    """The fields of the JSON object ``raw``, each as its bytes; or the 400 that says why it is not one."""
    try:
        return _decode_fields(raw)
    except msgspec.ValidationError:
        raise InvalidRequest("request body must be a JSON object") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {_body_problem(raw, exc)}") from None


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _body_problem(raw: bytes, exc: BaseException) -> str:
    """What is wrong with a body msgspec refused. orjson says where (line and column), and says "no low
    surrogate" where msgspec says "Input data was truncated"; it is asked only once the body is known bad."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as orjson_exc:
        return str(orjson_exc)
    return _reason(exc)  # e.g. nesting orjson allows and msgspec does not


def check_create_fields(body: dict[str, Any], priority: Any) -> tuple[str, dict[str, str] | None]:
    """The create's endpoint and metadata, once every top-level field is as a create takes it."""
    for name in body:
        if name in UNSUPPORTED_FIELDS:
            raise InvalidRequest(UNSUPPORTED_FIELDS[name], param=name)
        if name not in CREATE_FIELDS:
            raise unrecognized_argument(name)
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of: {', '.join(ENDPOINTS)}", param="endpoint")
    if body.get("completion_window") not in WINDOWS:
        raise InvalidRequest('completion_window must be "24h"', param="completion_window")
    if priority not in (Priority.STANDARD.value, Priority.EXPEDITED.value):
        raise InvalidRequest('priority must be "standard" or "expedited"', param="priority")
    metadata = check_metadata(body.get("metadata"))
    has_file, has_inline = "input_file_id" in body, "requests" in body
    if has_file == has_inline:
        raise InvalidRequest("give exactly one of input_file_id and requests", param="input_file_id")
    if has_file and not isinstance(body["input_file_id"], str):
        raise InvalidRequest("input_file_id must be a string", param="input_file_id")
    if has_inline and (not isinstance(body["requests"], list) or not body["requests"]):
        raise InvalidRequest("requests must be a non-empty list of request objects", param="requests")
    if not isinstance(body.get("dry_run", False), bool):
        raise InvalidRequest("dry_run must be true or false", param="dry_run")
    return endpoint, metadata


def check_metadata(metadata: Any) -> dict[str, str] | None:
    """A batch's metadata as a create or an update takes it: at most 32 string values under keys of at most 64
    characters, each value at most 512; an empty map is None."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be an object of string values", param="metadata")
    if len(metadata) > 32:
        raise InvalidRequest("metadata takes at most 32 keys", param="metadata")
    for k, v in metadata.items():
        if len(k) > 64:
            raise InvalidRequest(f"metadata key {k[:64]!r}... is longer than 64 characters", param="metadata")
        if not isinstance(v, str):
            raise InvalidRequest(f"metadata value of {k!r} must be a string", param="metadata")
        if len(v) > 512:
            raise InvalidRequest(f"metadata value of {k!r} is longer than 512 characters", param="metadata")
    return metadata or None
