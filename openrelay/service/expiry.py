"""A file's expiry as OpenAI takes it: ``{"anchor": "created_at", "seconds": N}``, N from the floor
(``--min-expiry-seconds``, OpenAI's one hour by default) to 30 days. The same rule for a create's
``output_expires_after`` (JSON) and an upload's ``expires_after`` (multipart fields ``expires_after[anchor]`` and
``expires_after[seconds]``, as the OpenAI SDK sends them)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest

__all__ = ["ANCHOR", "MAX_EXPIRY_SECONDS", "output_expiry", "upload_expiry"]

ANCHOR = "created_at"  # the only anchor OpenAI offers: the file's own created_at
MAX_EXPIRY_SECONDS = 2_592_000  # 30 days, OpenAI's ceiling


def output_expiry(value: Any, *, min_seconds: int) -> int | None:
    """The seconds of a create's ``output_expires_after`` (None when it is not given)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"anchor", "seconds"}:
        raise InvalidRequest('output_expires_after must be an object {"anchor": "created_at", "seconds": N}',
                             param="output_expires_after")
    seconds = value.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        seconds = None
    return _checked(value.get("anchor"), seconds, field="output_expires_after", min_seconds=min_seconds)


def upload_expiry(fields: dict[str, str], *, min_seconds: int) -> int | None:
    """The seconds of an upload's ``expires_after`` form fields (None when neither is given)."""
    anchor, raw = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
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
