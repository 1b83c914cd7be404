"""The one form of HTTP ``Range`` a download honors: ``bytes=N-``, the bytes from offset N to the end.

That is what a reader following a result file while its batch runs needs (``orl batches results --follow``):
each read asks for what came after the last one. Every other form (suffixes, several ranges, other units) is
ignored and the whole file is sent, as RFC 9110 allows.
"""

from __future__ import annotations

import re

__all__ = ["range_start", "content_range"]

_OPEN_RANGE = re.compile(r"bytes=(\d{1,18})-")


def range_start(header: str | None) -> int | None:
    """The offset of ``Range: bytes=N-``; None for no header or any other form."""
    if header is None:
        return None
    found = _OPEN_RANGE.fullmatch(header.strip())
    return int(found[1]) if found else None


def content_range(start: int, size: int) -> str:
    """``Content-Range`` of a 206 from ``start`` to the end of ``size`` bytes, or of a 416 when ``start`` is past
    the end."""
    return f"bytes {start}-{size - 1}/{size}" if start < size else f"bytes */{size}"
