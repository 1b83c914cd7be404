"""Reading JSONL input in blocks of whole lines, about a megabyte at a time, so that a scan's per-line work runs
over a list and its per-block work (``records.NumberGate``, ``prefix.PrefixCollector``) once a megabyte."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from ..errors import InputRefused, StoreError, StoreUnavailable

__all__ = ["Block", "read_blocks", "numbered_lines", "is_utf8", "BOM"]

_BLOCK = 1 << 20
BOM = b"\xef\xbb\xbf"  # U+FEFF in UTF-8


class Block:
    """``lines`` of the input from line ``first`` (``count`` of them), and ``data``, the lines joined by newlines
    (none at the end). Inline requests may hold newlines of their own: ``of_lines`` keeps them as they are."""

    __slots__ = ("first", "data", "lines", "count", "_lengths")

    def __init__(self, first: int, data: bytes, lines: list[bytes] | None = None) -> None:
        self.first = first
        self.data = data
        self.lines = data.split(b"\n") if lines is None else lines
        self.count = len(self.lines)
        self._lengths: np.ndarray | None = None

    @classmethod
    def of_lines(cls, first: int, lines: list[bytes]) -> Block:
        return cls(first, b"\n".join(lines), lines)

    def lengths(self) -> np.ndarray:
        """Each line's length in bytes (int64)."""
        if self._lengths is None:
            self._lengths = np.fromiter(map(len, self.lines), np.int64, self.count)
        return self._lengths


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _too_long(number: int, limit: int) -> InputRefused:
    return InputRefused(f"line {number} is longer than {limit} bytes; the input cannot be read",
                        code="input_unreadable")


def read_blocks(handle: BinaryIO, max_line_bytes: int) -> Iterator[Block]:
    """The input's lines in blocks (about a megabyte each), blank lines included.

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
                yield Block(number, b"".join(carry))
            return
        cut = chunk.rfind(b"\n")
        if cut < 0:
            # One long line still arriving: keep its pieces rather than re-copying it per block.
            carry.append(chunk)
            carried += len(chunk)
            if carried > max_line_bytes:
                raise _too_long(number, max_line_bytes)
            continue
        data = b"".join([*carry, memoryview(chunk)[:cut]]) if carry else chunk[:cut]  # one copy, not two
        tail = chunk[cut + 1:]
        carry, carried = ([tail], len(tail)) if tail else ([], 0)
        block = Block(number, data)
        if len(data) > max_line_bytes and (too_long := block.lengths() > max_line_bytes).any():
            first_long = int(too_long.argmax())
            if first_long:
                # The lines before it were read: the scan must see them, since a workflow record among them
                # refuses the create whatever follows (docs/api-contract.md §3).
                yield Block.of_lines(number, block.lines[:first_long])
            raise _too_long(number + first_long, max_line_bytes)
        yield block
        number += block.count


def numbered_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of every non-blank line."""
    for block in read_blocks(handle, max_line_bytes):
        for offset, raw in enumerate(block.lines):
            if raw and not raw.isspace():
                yield block.first + offset, raw
