"""Go encoding/json syntax-error messages, derived by hand from scanner.go.

Note the end-of-input rule: Go's scanner feeds one space at EOF, so input
cut off inside a literal, number or escape names that space (e.g. ``-`` ->
"invalid character ' ' in numeric literal"); only input cut off between
tokens or inside a plain string says "unexpected end of JSON input".
"""

from __future__ import annotations

import orjson
import pytest

from openrelay.validation.gojson import syntax_error_message

EOF = "unexpected end of JSON input"

CASES: list[tuple[bytes, str]] = [
    # literals true / false / null
    (b"nope", "invalid character 'o' in literal null (expecting 'u')"),
    (b'{"a": nul}', "invalid character '}' in literal null (expecting 'l')"),
    (b'{"a": nulx}', "invalid character 'x' in literal null (expecting 'l')"),
    (b"tRue", "invalid character 'R' in literal true (expecting 'r')"),
    (b"trUe", "invalid character 'U' in literal true (expecting 'u')"),
    (b"[truE]", "invalid character 'E' in literal true (expecting 'e')"),
    (b"fxlse", "invalid character 'x' in literal false (expecting 'a')"),
    (b"faLse", "invalid character 'L' in literal false (expecting 'l')"),
    (b"falSe", "invalid character 'S' in literal false (expecting 's')"),
    (b"fals", "invalid character ' ' in literal false (expecting 'e')"),
    # beginning of value
    (b"[1,]", "invalid character ']' looking for beginning of value"),
    (b"NaN", "invalid character 'N' looking for beginning of value"),
    (b'{"a": True}', "invalid character 'T' looking for beginning of value"),
    (b"+1", "invalid character '+' looking for beginning of value"),
    # objects
    (b"{'a':1}", "invalid character '\\'' looking for beginning of object key string"),
    (b'{"a":1,}', "invalid character '}' looking for beginning of object key string"),
    (b"{,}", "invalid character ',' looking for beginning of object key string"),
    (b'{"a" 1}', "invalid character '1' after object key"),
    (b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
    (b'{"a":1]', "invalid character ']' after object key:value pair"),
    # arrays
    (b"[1 2]", "invalid character '2' after array element"),
    (b"[1}", "invalid character '}' after array element"),
    # after top-level value
    (b'{"a":1}x', "invalid character 'x' after top-level value"),
    (b"01", "invalid character '1' after top-level value"),
    (b"-01", "invalid character '1' after top-level value"),
    (b"1.5.2", "invalid character '.' after top-level value"),
    (b"[1,2]]", "invalid character ']' after top-level value"),
    (b'{"a":1} {"b":2}', "invalid character '{' after top-level value"),
    # strings
    (b'"\\q"', "invalid character 'q' in string escape code"),
    (b'"\\', "invalid character ' ' in string escape code"),
    (b'{"a":"x\ny"}', "invalid character '\\n' in string literal"),
    (b'"a\tb"', "invalid character '\\t' in string literal"),
    (b'"\x01"', "invalid character '\\x01' in string literal"),
    (b'"\\u12g4"', "invalid character 'g' in \\u hexadecimal character escape"),
    (b'"\\uZ"', "invalid character 'Z' in \\u hexadecimal character escape"),
    (b'"\\u12', "invalid character ' ' in \\u hexadecimal character escape"),
    # numbers
    (b"-", "invalid character ' ' in numeric literal"),
    (b"-x", "invalid character 'x' in numeric literal"),
    (b"[-.5]", "invalid character '.' in numeric literal"),
    (b"1.e5", "invalid character 'e' after decimal point in numeric literal"),
    (b"1.", "invalid character ' ' after decimal point in numeric literal"),
    (b"1e+", "invalid character ' ' in exponent of numeric literal"),
    (b"1e", "invalid character ' ' in exponent of numeric literal"),
    (b'{"a":1E+x}', "invalid character 'x' in exponent of numeric literal"),
    # truncated input between tokens or inside a plain string
    (b'{"a":1', EOF),
    (b"", EOF),
    (b"  \t\r ", EOF),
    (b"[", EOF),
    (b'{"a"', EOF),
    (b'{"a":', EOF),
    (b'{"a":"unterminated', EOF),
    (b"[1,2", EOF),
    # quoteChar renders the byte value as a rune, not decoded UTF-8
    (b"\\", "invalid character '\\\\' looking for beginning of value"),
    (b"\x00", "invalid character '\\x00' looking for beginning of value"),
    (b"\x0b", "invalid character '\\v' looking for beginning of value"),
    (b"\x7f", "invalid character '\\x7f' looking for beginning of value"),
    ("é".encode(), "invalid character 'Ã' looking for beginning of value"),
    (b"\x85", "invalid character '\\u0085' looking for beginning of value"),
    (b"[1]\xa0", "invalid character '\\u00a0' after top-level value"),
    (b"\xad", "invalid character '\\u00ad' looking for beginning of value"),
    (b"\xff", "invalid character '\xff' looking for beginning of value"),
    ("\ufeff{}".encode(), "invalid character 'ï' looking for beginning of value"),
    # first error in scan order wins
    (b'{"a":"\x01", "b": nul', "invalid character '\\x01' in string literal"),
    # nesting limit: the 10001st open bracket fails
    (b"[" * 10001, "invalid character '[' exceeded max depth"),
    (b"[" * 10000, EOF),
    (b'{"a":' * 10000 + b"{", "invalid character '{' exceeded max depth"),
]


@pytest.mark.parametrize(("data", "expected"), CASES, ids=[repr(d[:24]) for d, _ in CASES])
def test_go_syntax_error_message(data: bytes, expected: str) -> None:
    assert syntax_error_message(data) == expected


@pytest.mark.parametrize(("data", "_expected"), CASES, ids=[repr(d[:24]) for d, _ in CASES])
def test_cases_are_lines_orjson_refuses(data: bytes, _expected: str) -> None:
    # The helper is only called after orjson fails; keep the table realistic.
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(data)


@pytest.mark.parametrize(
    "data",
    [b'{"a":1} ', b'"\xff\xfe"', b'"\x7f"', b"[]", b"{ }", b'[1, {"a": [true, false, null]}, -0.5e-3]'],
)
def test_go_valid_input_returns_generic_message(data: bytes) -> None:
    # Go accepts these (it does not check UTF-8 inside strings), so there is
    # no Go syntax error to mirror.
    assert syntax_error_message(data) == "invalid JSON"


def test_long_string_is_scanned_in_bulk_and_still_finds_late_error() -> None:
    data = b'{"body": "' + b"x" * 2_000_000 + b'"}!'
    assert syntax_error_message(data) == "invalid character '!' after top-level value"


def test_never_raises_on_unexpected_argument() -> None:
    assert syntax_error_message(None) == "invalid JSON"  # type: ignore[arg-type]
