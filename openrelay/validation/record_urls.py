"""Which endpoints an input's records name (their ``url``), counted without reading anything else of them: what
the dashboard's New batch form and `orl batches create` take the endpoint from when none is given. Only the count
is made here; the create still checks every record's ``url`` against the endpoint sent (``url_mismatch``)."""

from __future__ import annotations

from collections import Counter
from typing import BinaryIO

import msgspec

from ..errors import InputRefused
from .lines import numbered_lines
from .records import decode_record

__all__ = ["urls_of_records"]


def urls_of_records(handle: BinaryIO, *, max_records: int, max_line_bytes: int) -> Counter[str]:
    """How many records name each ``url`` (a string), over the first ``max_records`` records; a line that is not
    a JSON object, or names no url, counts for none. An unreadable rest of the input ends the count there."""
    counts: Counter[str] = Counter()
    try:
        for seen, (_number, raw) in enumerate(numbered_lines(handle, max_line_bytes)):
            if seen >= max_records:
                break
            try:
                url = decode_record(raw).url
            except (msgspec.DecodeError, RecursionError):
                continue
            if isinstance(url, str):
                counts[url] += 1
    except InputRefused:
        pass  # a line too long to read: the create will say so; the guess uses what came before it
    return counts
