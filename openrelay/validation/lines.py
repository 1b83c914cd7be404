"""Reading JSONL input in blocks: one C-level split per megabyte instead of one Python call per line."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from ..errors import InputRefused, StoreError, StoreUnavailable

__all__ = ["read_blocks", "numbered_lines", "BOM"]

_BLOCK = 1 << 20
BOM = b"\xef\xbb\xbf"  # U+FEFF in UTF-8


def _too_long(number: int, limit: int) -> InputRefused:
    return InputRefused(f"line {number} is longer than {limit} bytes; the input cannot be read",
                        code="input_unreadable")


def read_blocks(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, list[bytes]]]:
    """(number of the block's first line, its lines without newlines), blank lines included.

    A UTF-8 byte order mark at the very start (Windows editors write one) is not part of the first line. A line
    longer than ``max_line_bytes`` or a read error makes the input unreadable (``input_unreadable``).
    """
    number = 1
    carry: list[bytes] = []
    carried = 0
    head: bytes | None = b""  # the first bytes, until it is known whether they begin with a byte order mark
    while True:
        try:
            chunk = handle.read(_BLOCK)
        except StoreUnavailable:
            raise  # the store is away, not the input broken: a 503 to try again, not a 400
        except (OSError, StoreError) as exc:
            raise InputRefused(f"the input could not be read after line {number - 1}: {exc}",
                               code="input_unreadable") from exc
        if head is not None:
            ended = not chunk
            head += chunk
            if not ended and len(head) < len(BOM) and BOM.startswith(head):
                continue  # a read shorter than the mark: too soon to tell
            chunk, head = head.removeprefix(BOM), None
            if not chunk and not ended:
                continue  # the first read held the mark alone
        if not chunk:
            if carried > max_line_bytes:
                raise _too_long(number, max_line_bytes)
            if carried:
                yield number, [b"".join(carry)]
            return
        if b"\n" not in chunk:
            # One long line still arriving: keep its pieces rather than re-copying it per block.
            carry.append(chunk)
            carried += len(chunk)
            if carried > max_line_bytes:
                raise _too_long(number, max_line_bytes)
            continue
        parts = (b"".join(carry) + chunk if carry else chunk).split(b"\n")
        tail = parts.pop()
        carry, carried = ([tail], len(tail)) if tail else ([], 0)
        if max(map(len, parts)) > max_line_bytes:
            first_long = next(i for i, p in enumerate(parts) if len(p) > max_line_bytes)
            if first_long:
                # The lines before it were read: the scan must see them, since a workflow record among them
                # refuses the create whatever follows (docs/api-contract.md §3).
                yield number, parts[:first_long]
            raise _too_long(number + first_long, max_line_bytes)
        yield number, parts
        number += len(parts)


def numbered_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of every non-blank line."""
    for first, block in read_blocks(handle, max_line_bytes):
        for offset, raw in enumerate(block):
            if raw and not raw.isspace():
                yield first + offset, raw
