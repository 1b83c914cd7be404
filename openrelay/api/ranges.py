"""HTTP ``Range`` on a download: one byte range of any form RFC 9110 gives (``bytes=A-B``, ``A-``, ``-N``), answered
206; a range with no byte of the file 416; any other form the whole file, 200 (docs/api-contract.md §1)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

__all__ = ["requested_range", "content_range"]

_ONE_RANGE = re.compile(r"bytes=(\d{1,18})?-(\d{1,18})?")

Span = tuple[int, int]  # (start, stop) of the bytes asked for


def requested_range(header: str | None) -> Callable[[int], Span | None] | None:
    """What ``header`` asks of a file of a given size: its span, or None when the file has no byte of it (416).
    None for no header, or a form that is ignored."""
    found = _ONE_RANGE.fullmatch(header.strip()) if header is not None else None
    if found is None or (found[1] is None and found[2] is None):
        return None
    first, last = (None if value is None else int(value) for value in found.groups())
    if first is not None and last is not None and last < first:
        return None
    return functools.partial(_span, first, last)


def _span(first: int | None, last: int | None, size: int) -> Span | None:
    if first is None:  # the last ``last`` bytes
        return (max(0, size - last), size) if last and size else None
    return None if first >= size else (first, size if last is None else min(last + 1, size))


def content_range(span: Span, size: int) -> str:
    """``Content-Range`` of a 206 of bytes ``span`` of ``size``."""
    return f"bytes {span[0]}-{span[1] - 1}/{size}"
