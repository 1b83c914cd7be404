"""A file's expiry as OpenAI takes it: ``{"anchor": "created_at", "seconds": N}``, N from the floor
(``--min-expiry-seconds``, OpenAI's one hour by default) to 30 days. The same rule for a create's
``output_expires_after`` (JSON) and an upload's ``expires_after``: multipart fields ``expires_after[anchor]`` and
``expires_after[seconds]``, as the OpenAI SDK sends them, or one ``expires_after`` part holding the JSON object, as
OpenAI's OpenAPI document encodes it."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import InvalidRequest

__all__ = ["ANCHOR", "MAX_EXPIRY_SECONDS", "output_expiry", "upload_expiry"]

ANCHOR = "created_at"  # the only anchor OpenAI offers: the file's own created_at
MAX_EXPIRY_SECONDS = 2_592_000  # 30 days, OpenAI's ceiling


def output_expiry(value: Any, *, min_seconds: int, field: str = "output_expires_after") -> int | None:
    """The seconds of an expiry object (None when it is not given): a create's ``output_expires_after``, or
    ``field``'s (an upload's JSON ``expires_after``)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"anchor", "seconds"}:
        raise InvalidRequest(f'{field} must be an object {{"anchor": "created_at", "seconds": N}}', param=field)
    seconds = value.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        seconds = None
    return _checked(value.get("anchor"), seconds, field=field, min_seconds=min_seconds)


def upload_expiry(fields: dict[str, str], *, min_seconds: int) -> int | None:
    """The seconds of an upload's ``expires_after`` form fields (None when none is given)."""
    anchor, raw = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if "expires_after" in fields:
        if anchor is not None or raw is not None:
            raise InvalidRequest("expires_after is given twice: send either one expires_after part (JSON) or "
                                 "expires_after[anchor] and expires_after[seconds]", param="expires_after")
        try:
            value = orjson.loads(fields["expires_after"])
        except orjson.JSONDecodeError:
            value = fields["expires_after"]  # refused as not the object
        return output_expiry(value, min_seconds=min_seconds, field="expires_after")
    if anchor is None and raw is None:
        return None
    seconds = int(raw) if raw is not None and raw.isascii() and raw.isdecimal() and len(raw) < 19 else None
    return _checked(anchor, seconds, field="expires_after", min_seconds=min_seconds)


def _checked(anchor: Any, seconds: int | None, *, field: str, min_seconds: int) -> int:
    if anchor != ANCHOR:
        raise InvalidRequest(f'{field}.anchor must be "{ANCHOR}"', param=f"{field}.anchor")
    if seconds is None or not min_seconds <= seconds <= MAX_EXPIRY_SECONDS:
        raise InvalidRequest(f"{field}.seconds must be a whole number of seconds from {min_seconds} to "
                             f"{MAX_EXPIRY_SECONDS} (30 days)", param=f"{field}.seconds")
    return seconds
