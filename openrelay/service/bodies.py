"""Request bodies of the JSON routes, read one way."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import InvalidRequest

__all__ = ["json_object"]


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, or the 400 that says why it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body
