"""Bodies of the JSON routes, read one way, and the OpenAI list envelope every list answers in."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import orjson

from ..errors import InvalidRequest

__all__ = ["json_object", "reject_unrecognized", "unrecognized_argument", "SHOWN_ARGUMENT", "list_page"]

SHOWN_ARGUMENT = 256  # an unknown field's name is echoed up to this many characters, "..." included


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, or the 400 that says why it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def unrecognized_argument(name: str) -> InvalidRequest:
    """The 400 for a field the route does not take, named as OpenAI names it (a long name cut, ending "...")."""
    shown = name if len(name) <= SHOWN_ARGUMENT else name[:SHOWN_ARGUMENT - 3] + "..."
    return InvalidRequest(f"Unrecognized request argument supplied: {shown}", param=shown)


def reject_unrecognized(body: dict[str, Any], known: Collection[str]) -> None:
    """The 400 of the first field of ``body`` that is not ``known``, if there is one."""
    for name in body:
        if name not in known:
            raise unrecognized_argument(name)


def list_page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
