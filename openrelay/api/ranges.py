"""HTTP ``Range`` on a download: one byte range of any form RFC 9110 gives, answered 206 with those bytes.

``bytes=A-B`` (B past the end reads to the end), ``bytes=A-`` (what a follower of a running batch's result file
asks: what came after its last read) and ``bytes=-N`` (the last N bytes, or the whole file when it is shorter).
A range the file has no byte of is 416 with ``Content-Range: bytes */SIZE``. Several ranges, another unit, B before
A or any other form is ignored and the whole file is sent, 200, as RFC 9110 allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ByteRange", "requested_range", "content_range"]

_ONE_RANGE = re.compile(r"bytes=(\d{1,18})?-(\d{1,18})?")


@dataclass(frozen=True, slots=True)
class ByteRange:
    first: int | None  # None: a suffix range, the last ``last`` bytes
    last: int | None  # None: to the end

    def span(self, size: int) -> tuple[int, int] | None:
        """(start, stop) of what it asks of ``size`` bytes; None when that is nothing (416)."""
        if self.first is None:
            assert self.last is not None
            return (max(0, size - self.last), size) if self.last and size else None
        if self.first >= size:
            return None
        return self.first, size if self.last is None else min(self.last + 1, size)


def requested_range(header: str | None) -> ByteRange | None:
    """The one range ``header`` asks for; None for no header, or any form that is ignored."""
    found = _ONE_RANGE.fullmatch(header.strip()) if header is not None else None
    if found is None or (found[1] is None and found[2] is None):
        return None
    first, last = (None if value is None else int(value) for value in found.groups())
    if first is not None and last is not None and last < first:
        return None
    return ByteRange(first, last)


def content_range(span: tuple[int, int], size: int) -> str:
    """``Content-Range`` of a 206 of bytes ``span`` of ``size``."""
    return f"bytes {span[0]}-{span[1] - 1}/{size}"
