"""Reading JSONL input in blocks of whole lines: one C-level search per megabyte instead of one Python call per
line, and the lines split apart only where a caller asks for them (the create's scan mostly reads a block whole)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from ..errors import InputRefused, StoreError, StoreUnavailable

__all__ = ["Block", "read_blocks", "numbered_lines", "is_utf8", "BOM"]

_BLOCK = 1 << 20
BOM = b"\xef\xbb\xbf"  # U+FEFF in UTF-8


class Block:
    """``count`` whole lines of the input from line ``first``: ``data`` holds them joined by newlines (none at
    the end); ``lines`` and ``lengths()`` are worked out on first use."""

    __slots__ = ("first", "data", "count", "_lines", "_lengths", "_newlines")

    def __init__(self, first: int, data: bytes, count: int | None = None, lines: list[bytes] | None = None,
                 newlines: np.ndarray | None = None) -> None:
        """``count`` None: one line a newline in ``data``, and one more. ``newlines``: where ``data`` holds
        one, when the caller found them already."""
        self.first = first
        self.data = data
        self._lines = lines
        self._lengths: np.ndarray | None = None
        self._newlines = newlines
        self.count = len(self.newlines()) + 1 if count is None else count

    @classmethod
    def of_lines(cls, first: int, lines: list[bytes]) -> Block:
        """A block of items that may hold newlines of their own (inline requests): ``count`` is theirs."""
        return cls(first, b"\n".join(lines), len(lines), lines)

    @property
    def lines(self) -> list[bytes]:
        if self._lines is None:
            self._lines = self.data.split(b"\n")
        return self._lines

    def newlines(self) -> np.ndarray:
        """Where ``data`` holds a newline (int64 indices)."""
        if self._newlines is None:
            self._newlines = np.flatnonzero(np.frombuffer(self.data, np.uint8) == 10)
        return self._newlines

    def every_line_opens(self) -> bool:
        """Whether every line begins with a character other than JSON whitespace (none is blank), and the lines
        are ``data``'s newline-separated parts (no inline request holds newlines of its own)."""
        data = self.data
        newlines = self.newlines()
        if len(newlines) != self.count - 1 or not data or data[0] in _BLANK or data[-1] == _NEWLINE:
            return False
        after = np.frombuffer(data, np.uint8)[newlines + 1]  # each line's first byte but the first line's
        return not ((after == 32) | (after == 9) | (after == 13) | (after == 10)).any()

    def lengths(self) -> np.ndarray:
        """Each line's length in bytes (int64)."""
        if self._lengths is None:
            if self._lines is not None:
                self._lengths = np.fromiter(map(len, self._lines), np.int64, self.count)
            else:
                self._lengths = np.diff(self.newlines(), prepend=-1, append=len(self.data)) - 1
        return self._lengths


_BLANK = b" \t\r\n"  # JSON's whitespace: a line beginning with one may be blank
_NEWLINE = 10


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

    Each block's newlines are marked in one scratch array, reused from block to block: a fresh megabyte each
    time would cost its page faults each time (half of a create's over HTTP, where the allocator of the server's
    worker thread hands the memory back between blocks).
    """
    number = 1
    carry: list[bytes] = []
    carried = 0
    head: bytes | None = b""  # the first bytes, until it is known whether they begin with a byte order mark
    marks = np.empty(_BLOCK, np.bool_)
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
                yield Block(number, b"".join(carry), 1)
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
        if len(marks) < len(data):
            marks = np.empty(len(data), np.bool_)
        newlines = np.flatnonzero(np.equal(np.frombuffer(data, np.uint8), _NEWLINE, out=marks[:len(data)]))
        block = Block(number, data, len(newlines) + 1, newlines=newlines)
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
