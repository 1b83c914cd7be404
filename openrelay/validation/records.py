"""How a create reads a record from its line for the rules (``rules.check_record``): a ``Record`` read by msgspec,
or from the whole parse (``parse_line``, Go's messages for what it refuses). Why two ways: docs/design.md, "A
create's rules"."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import orjson

from ..prefix import PROMPT_FIELDS
from .gojson import unmarshal_error_message
from .lines import Block

__all__ = ["Record", "Body", "RULE_FIELDS", "UNSET", "read_record", "record_of", "decode_record", "decode_lines",
           "parse_line", "ParseFailure", "MAX_DEPTH", "NumberGate"]

MAX_DEPTH = 1024  # orjson's nesting limit: a record nested deeper is refused in Go's words for its own limit


class ParseFailure(Exception):
    """The line is not a JSON object; ``str(exc)`` is the message shown to the user."""


def parse_line(raw: bytes) -> Any:
    """The record on one line; ParseFailure with the message Go's decoder gives when it is not JSON we can run.

    orjson reads nearly every line. What it refuses is refused with Go's message: a syntax error, nesting past
    ``MAX_DEPTH``, or a number outside the float range (``1e400``: no engine could be sent it). An integer too
    long for a float64 is no error (integers keep every digit): msgspec reads it exactly.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseFailure(f"invalid UTF-8 at byte {exc.start}") from None
    message = unmarshal_error_message(raw, MAX_DEPTH)
    if message is not None:
        raise ParseFailure(message) from None
    try:
        return _exact_decode(raw)
    except (msgspec.DecodeError, RecursionError):  # e.g. a lone UTF-16 surrogate escape
        raise ParseFailure("invalid JSON") from None


_exact_decode = msgspec.json.Decoder().decode

UNSET = msgspec.UNSET
RULE_FIELDS = ("model", "stream", "openrelay", "tool_config")  # the fields of a body the rules read
# The fields the rules read of a record's body (absent: ``UNSET``), and its prompt fields (``prefix.PROMPT_FIELDS``)
# as raw JSON bytes; the rest of the body is skipped. gc=False: values decoded from JSON hold no cycle, and the
# collector need not track 50,000 of them.
Body = msgspec.defstruct("Body", [*((name, Any, UNSET) for name in RULE_FIELDS), *(
    (name, msgspec.Raw | msgspec.UnsetType, UNSET) for name in sorted(set().union(*PROMPT_FIELDS.values())))],
    gc=False)


class Record(msgspec.Struct, gc=False):
    """A record as the rules see it (``check_record`` reads nothing else): these fields, whatever their types."""

    custom_id: Any = UNSET
    method: Any = UNSET
    url: Any = UNSET
    body: Body | list[Any] | str | int | float | bool | None | msgspec.UnsetType = UNSET  # type: ignore[valid-type]
    tool_config: Any = UNSET
    openrelay: Any = UNSET


_decoder = msgspec.json.Decoder(Record)
decode_record, decode_lines = _decoder.decode, _decoder.decode_lines


def read_record(raw: bytes, *, whole: bool = True) -> Any:
    """The line's ``Record``, or its JSON value when that is no object; ParseFailure when it is not JSON we run.
    msgspec's skipping checks neither UTF-8 nor the range of numbers: ``whole``, for a line that may hold either,
    parses it whole first. A line msgspec cannot read (no object, or nested past its depth) is taken from the
    whole parse."""
    if whole:
        value = parse_line(raw)
    try:
        return decode_record(raw)
    except (msgspec.DecodeError, RecursionError):
        pass
    return record_of(value if whole else parse_line(raw))


def record_of(value: Any) -> Any:
    """The ``Record`` of a parsed JSON object (without the prompt's raw bytes); any other value as it is."""
    if not isinstance(value, dict):
        return value
    fields = {name: value[name] for name in Record.__struct_fields__ if name in value}
    if isinstance(fields.get("body"), dict):
        fields["body"] = Body(**{name: fields["body"][name] for name in RULE_FIELDS if name in fields["body"]})
    return Record(**fields)


class NumberGate:
    """Which lines of a block could hold a number outside the float range, found for the whole block at once: a
    digit, ``e`` or ``E``, an optional sign and three digits (``1e400``), or a run of 210 digits, looked for at
    every 105th byte (docs/design.md, "A create's rules"). Digits in strings are found too, costing a whole read.
    """

    _STRIDE = 105  # half the shortest run to find
    _WINDOW = _STRIDE * 10_000  # bytes looked at per step, a multiple of the stride; scratch arrays this long
    _OVERLAP = 256  # a window also looks this far into the next: a pattern or run that starts in it is seen
    _BEYOND = 8  # scratch past a window's end, read as "not a digit": a candidate's next bytes need no bounds checks

    def __init__(self) -> None:
        # Kept between blocks: fresh megabyte arrays would cost their page faults every block.
        size = self._WINDOW + self._OVERLAP + self._BEYOND
        self._work = np.empty(size, np.uint8)
        self._digit = np.empty(size, np.bool_)
        self._digit_e = np.empty(size, np.bool_)

    def suspects(self, block: Block) -> tuple[set[int], bool]:
        """(indices of the lines of ``block`` to read whole, mostly none; whether the block is all ASCII)."""
        found: list[int] = []
        view = memoryview(block.data)
        for start in range(0, len(view), self._WINDOW):
            window = view[start:start + self._WINDOW + self._OVERLAP]
            found.extend(start + position for position in self._positions(window))
        if not found:
            return set(), block.data.isascii()
        starts = np.cumsum(block.lengths() + 1) - (block.lengths() + 1)  # where each line begins in ``data``
        return set((np.searchsorted(starts, found, side="right") - 1).tolist()), block.data.isascii()

    def _positions(self, window: memoryview) -> list[int]:
        n = len(window)
        if n < 2:
            return []
        data = np.frombuffer(window, np.uint8)
        work, digit, digit_e = self._work[:n], self._digit[:n], self._digit_e[:n - 1]
        np.less(np.subtract(data, 48, out=work), 10, out=digit)
        self._digit[n:n + self._BEYOND] = False
        np.equal(np.bitwise_or(data[1:], 32, out=work[:n - 1]), 101, out=digit_e)
        np.logical_and(digit_e, digit[:-1], out=digit_e)  # a digit, then e or E
        positions: list[int] = []
        if digit_e.any():
            found = np.flatnonzero(digit_e)
            after = found + 2  # at most n: one past the window, where the sign below reads its last byte instead
            sign = data.take(after, mode="clip")
            after = after + ((sign == 43) | (sign == 45))
            padded = self._digit  # its bytes past the window are False
            three = padded[after] & padded[after + 1] & padded[after + 2]
            positions.extend(found[three].tolist())
        sampled = digit[::self._STRIDE]
        runs = np.flatnonzero(sampled[:-1] & sampled[1:])
        if runs.size:
            positions.extend((runs * self._STRIDE).tolist())
        return positions
