"""The types of the request fields an engine of this process reads, checked before it runs a record: a field of
the wrong type is a 400 naming it, never an exception's text from deeper down."""

from __future__ import annotations

from typing import Any

__all__ = ["NUMBER", "INT", "BOOL", "STR", "OBJECT", "LIST", "STOP", "STR_OR_OBJECT", "wrong_type"]

NUMBER, INT, BOOL, STR, OBJECT, LIST = "a number", "an integer", "a boolean", "a string", "an object", "a list"
STOP, STR_OR_OBJECT = "a string or a list of strings", "a string or an object"
_TYPES: dict[str, Any] = {BOOL: bool, STR: str, OBJECT: dict, LIST: list, STR_OR_OBJECT: str | dict}


def _is(value: Any, kind: str) -> bool:
    if kind in (NUMBER, INT):  # JSON's true is not 1
        return not isinstance(value, bool) and isinstance(value, int if kind == INT else int | float)
    if kind == STOP:
        return isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, _TYPES[kind])


def wrong_type(body: dict[str, Any], fields: dict[str, str]) -> str | None:
    """The 400's message for the first of ``fields`` (name: kind) that ``body`` sets to a value of another type."""
    for name, kind in fields.items():
        value = body.get(name)
        if value is not None and not _is(value, kind):
            return f"{name}: must be {kind} (got {value!r:.50})"
    return None
