"""Go ``encoding/json`` syntax-error messages for JSONL lines orjson refused.

The documented rejection texts come from a Go implementation, so we mirror the
byte scanner that Go's ``json.Unmarshal`` runs over the whole input before
decoding (``scanner.go``, default non-jsonv2 build): the first error wins.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = ["syntax_error_message", "unmarshal_error_message"]

# Go caps nesting at 10000 open objects/arrays; the push that exceeds it fails.
_MAX_DEPTH = 10000

# What the innermost open container expects next.
_OBJECT_KEY = 0  # inside {, before the colon
_OBJECT_VALUE = 1  # inside {, after the colon
_ARRAY_VALUE = 2  # inside [

_SPACE = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset(b'bfnrt\\/"')
# Bytes Go accepts inside a string without a state change: anything but the
# closing quote, a backslash or a control byte (invalid UTF-8 is not checked).
_STRING_STOP = re.compile(rb'["\\\x00-\x1f]')
_NAMED_ESCAPES = {0x07: "\\a", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x0B: "\\v"}


def _quote_char(c: int) -> str:
    """Render byte ``c`` the way Go's ``quoteChar`` does.

    Go converts the *byte* to a rune (so 0xC3 is U+00C3 'Ã', never U+FFFD)
    and formats it with ``strconv.Quote``, swapping the double quotes for
    single ones; the two quote characters themselves are special-cased.
    """
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    if c == 0x5C:
        body = "\\\\"
    elif c in _NAMED_ESCAPES:
        body = _NAMED_ESCAPES[c]
    elif c < 0x20 or c == 0x7F:
        body = f"\\x{c:02x}"
    elif c < 0x7F or (c >= 0xA1 and c != 0xAD):
        # strconv.IsPrint: ASCII graphic and Latin-1 letters/symbols; the C1
        # controls, NO-BREAK SPACE and SOFT HYPHEN are escaped instead.
        body = chr(c)
    else:
        body = f"\\u{c:04x}"
    return f"'{body}'"


class _Scanner:
    """One state method per scanner state; ``step`` is the current one."""

    def __init__(self, max_depth: int = _MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self.stack: list[int] = []
        self.err: str | None = None
        self.end_top = False
        self.step: Callable[[int], None] = self.begin_value
        self.in_string = False  # lets the driver skip plain string bytes in bulk

    def fail(self, c: int, context: str) -> None:
        # The driver stops at the first error, as Go's checkValid does.
        self.err = f"invalid character {_quote_char(c)} {context}"

    def goto(self, state: Callable[[int], None]) -> None:
        self.step = state
        self.in_string = state == self.in_str

    def push(self, c: int, kind: int, nxt: Callable[[int], None]) -> None:
        self.stack.append(kind)
        self.goto(nxt)
        if len(self.stack) > self.max_depth:
            self.fail(c, "exceeded max depth")

    def pop(self) -> None:
        self.stack.pop()
        self.end_top = not self.stack
        self.goto(self.end_of_top if self.end_top else self.end_value)

    # -- values ------------------------------------------------------------
    def begin_value_or_empty(self, c: int) -> None:  # just after '['
        # ']' closes an empty array exactly like one after a finished value.
        (self.end_value if c == 0x5D else self.begin_value)(c)

    def begin_value(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == 0x7B:  # {
            self.push(c, _OBJECT_KEY, self.begin_key_or_empty)
        elif c == 0x5B:  # [
            self.push(c, _ARRAY_VALUE, self.begin_value_or_empty)
        elif c == 0x22:
            self.goto(self.in_str)
        elif c == 0x2D:  # -
            self.goto(self.neg)
        elif c == 0x30:  # a leading 0 may not be followed by more digits
            self.goto(self.zero)
        elif c in _DIGITS:
            self.goto(self.int_digits)
        elif c in _LITERALS:
            self.goto(self.literal(_LITERALS[c], 1))
        else:
            self.fail(c, "looking for beginning of value")

    def begin_key_or_empty(self, c: int) -> None:  # just after '{'
        if c == 0x7D:  # }: an empty object is closed like a finished value
            self.stack[-1] = _OBJECT_VALUE
            self.end_value(c)
        else:
            self.begin_key(c)

    def begin_key(self, c: int) -> None:
        if c in _SPACE:
            return
        if c == 0x22:
            self.goto(self.in_str)
        else:
            self.fail(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> None:
        """A value (or key) just finished; decide what the container wants."""
        if not self.stack:  # the top-level value ended before this byte
            self.end_top = True
            self.goto(self.end_of_top)
            self.end_of_top(c)
            return
        self.goto(self.end_value)
        if c in _SPACE:
            return
        kind = self.stack[-1]
        if kind == _OBJECT_KEY:
            if c == 0x3A:  # :
                self.stack[-1] = _OBJECT_VALUE
                self.goto(self.begin_value)
            else:
                self.fail(c, "after object key")
        elif kind == _OBJECT_VALUE:
            if c == 0x2C:  # ,
                self.stack[-1] = _OBJECT_KEY
                self.goto(self.begin_key)
            elif c == 0x7D:
                self.pop()
            else:
                self.fail(c, "after object key:value pair")
        elif c == 0x2C:
            self.goto(self.begin_value)
        elif c == 0x5D:
            self.pop()
        else:
            self.fail(c, "after array element")

    def end_of_top(self, c: int) -> None:
        if c not in _SPACE:
            self.fail(c, "after top-level value")

    # -- strings -----------------------------------------------------------
    def in_str(self, c: int) -> None:
        if c == 0x22:
            self.goto(self.end_value)
        elif c == 0x5C:
            self.goto(self.escape)
        elif c < 0x20:
            self.fail(c, "in string literal")

    def escape(self, c: int) -> None:
        if c in _SIMPLE_ESCAPES:
            self.goto(self.in_str)
        elif c == 0x75:  # u: exactly four hex digits follow
            self.goto(self.hex_digit(4))
        else:
            self.fail(c, "in string escape code")

    def hex_digit(self, remaining: int) -> Callable[[int], None]:
        def state(c: int) -> None:
            if c not in _HEX:
                return self.fail(c, "in \\u hexadecimal character escape")
            self.goto(self.in_str if remaining == 1 else self.hex_digit(remaining - 1))

        return state

    # -- numbers -----------------------------------------------------------
    def neg(self, c: int) -> None:
        if c == 0x30:
            self.goto(self.zero)
        elif c in _DIGITS:
            self.goto(self.int_digits)
        else:
            self.fail(c, "in numeric literal")

    def int_digits(self, c: int) -> None:
        if c not in _DIGITS:
            self.zero(c)

    def zero(self, c: int) -> None:  # integer part done: fraction, exponent or end
        if c == 0x2E:
            self.goto(self.dot)
        elif c in b"eE":
            self.goto(self.exp)
        else:
            self.end_value(c)

    def dot(self, c: int) -> None:
        if c in _DIGITS:
            self.goto(self.frac_digits)
        else:
            self.fail(c, "after decimal point in numeric literal")

    def frac_digits(self, c: int) -> None:
        if c in b"eE":
            self.goto(self.exp)
        elif c not in _DIGITS:
            self.end_value(c)

    def exp(self, c: int) -> None:  # the sign is optional
        self.goto(self.exp_sign) if c in b"+-" else self.exp_sign(c)

    def exp_sign(self, c: int) -> None:
        if c in _DIGITS:
            self.goto(self.exp_digits)
        else:
            self.fail(c, "in exponent of numeric literal")

    def exp_digits(self, c: int) -> None:
        if c not in _DIGITS:
            self.end_value(c)

    # -- true / false / null ----------------------------------------------
    def literal(self, word: str, pos: int) -> Callable[[int], None]:
        """State after reading ``word[:pos]``; Go names the byte it expected."""

        def state(c: int) -> None:
            if c != ord(word[pos]):
                return self.fail(c, f"in literal {word} (expecting '{word[pos]}')")
            self.goto(self.end_value if pos + 1 == len(word) else self.literal(word, pos + 1))

        return state


_LITERALS = {ord("t"): "true", ord("f"): "false", ord("n"): "null"}


def syntax_error_message(data: bytes, max_depth: int = _MAX_DEPTH) -> str:
    """Return the message Go's ``json.Unmarshal`` gives for ``data``.

    Returns ``"invalid JSON"`` if Go would accept the bytes (orjson is
    stricter in a few places, e.g. invalid UTF-8 inside strings).
    ``max_depth`` lowers Go's nesting cap to a parser's own (Go's wording).
    """
    try:
        buf = bytes(data)
        s = _Scanner(max_depth)
        i, n = 0, len(buf)
        while i < n:
            if s.in_string:
                # Plain string content cannot change the state; skip it at C speed.
                stop = _STRING_STOP.search(buf, i)
                i = stop.start() if stop else n
                if i >= n:
                    break
            s.step(buf[i])
            if s.err is not None:
                return s.err
            i += 1
        # At end of input Go feeds one space: it completes a pending number but
        # is itself "invalid" inside an unfinished literal, number or escape.
        if not s.end_top:
            s.step(0x20)
        if s.err is not None:
            return s.err
        if not s.end_top:
            return "unexpected end of JSON input"
        return "invalid JSON"
    except Exception:  # never let a diagnostics helper break ingestion
        return "invalid JSON"


# In syntactically valid JSON a digit outside a string is part of a number, so skipping strings whole leaves
# exactly the number literals.
_SHOWN_NUMBER = 64  # Go echoes the literal whole; a 300-digit one is cut here
_STRING_OR_NUMBER = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)')


def unmarshal_error_message(data: bytes, max_depth: int = _MAX_DEPTH) -> str | None:
    """The message Go's ``json.Unmarshal`` into an ``any`` gives for ``data``, or None when it would succeed.

    A syntax error comes first (Go checks the whole input before decoding). Then the first number that does
    not fit a float64, as Go's decoder reports it: ``json: cannot unmarshal number 1e400 into Go value of type
    float64``. Integer literals are left alone whatever their size: they are kept exact, never made floats.
    """
    message = syntax_error_message(data, max_depth)
    if message != "invalid JSON":
        return message
    try:
        for match in _STRING_OR_NUMBER.finditer(bytes(data)):
            number = match.group(1)
            if number is not None and number.strip(b"-0123456789") and math.isinf(float(number)):
                shown = number.decode()
                if len(shown) > _SHOWN_NUMBER:
                    shown = shown[:_SHOWN_NUMBER - 3] + "..."
                return f"json: cannot unmarshal number {shown} into Go value of type float64"
    except Exception:  # never let a diagnostics helper break ingestion
        return None
    return None
