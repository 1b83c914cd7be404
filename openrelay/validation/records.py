"""The per-record rules of a create (docs/api-contract.md §4), in the order they are checked, and how a record is read.

``check_record`` decides everything a record can be judged on alone. The two rules that need the whole input,
``duplicate_custom_id`` and ``model_mismatch``, are decided by ``scan`` once every record has been read.

The scan's fast path reads the ordinary record (``decode_ordinary``): its four fields, the few of the body the rules
look at, and the prompt fields as raw bytes; the rest of the body is skipped. Skipping checks the syntax, the
escapes and the nesting, but not two things the full parse refuses, so the scan checks those apart: invalid
UTF-8 (a block or line that is ASCII has none) and numbers outside the float range (``NumberGate``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import orjson

from ..catalog import Catalog
from .gojson import unmarshal_error_message
from .lines import Block
from .tool_config import tool_config_problem

__all__ = ["Verdict", "parse_line", "check_record", "cut_custom_id", "ParseFailure", "MAX_DEPTH",
           "decode_ordinary", "decode_whole", "decode_prompt", "NumberGate"]

CUSTOM_ID_LIMIT = 512  # bytes of the JSON-escaped custom_id shown back to the user
MAX_DEPTH = 1024  # orjson's nesting limit: a record nested deeper is refused in Go's words for its own limit


@dataclass(frozen=True, slots=True)
class Verdict:
    custom_id: str  # "" when the record names none
    code: str | None  # None: passes every single-record rule
    message: str | None
    model: str | None


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

_UNSET = msgspec.UNSET
_MaybeRaw = msgspec.Raw | msgspec.UnsetType
_ordinary_decoders: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Any] = {}


def decode_ordinary(endpoint: str, offered: Iterable[str], prompt_fields: tuple[str, ...] = ()) -> Any:
    """A decoder of the ordinary record of ``endpoint``, which passes every rule a record is judged on alone:
    exactly its four fields, a non-empty ``custom_id``, ``POST``, the endpoint's url, and a body with an
    ``offered`` model, no ``"stream": true``, no ``openrelay`` or ``tool_config``. The types say it all, so any
    other record fails to decode (``msgspec.ValidationError``) and is left to the full rules. The body's
    ``prompt_fields`` come as raw bytes; the rest of the body is skipped.

    ``model`` comes back as the interned name: the same object for every record that names it. The decoder is
    a ``msgspec.json.Decoder``: ``decode`` for one line, ``decode_lines`` for a block of them."""
    models = tuple(sorted(offered))
    key = (endpoint, models, prompt_fields)
    decode = _ordinary_decoders.get(key)
    if decode is None:
        if not models:
            return _NO_RECORD
        body = msgspec.defstruct("OrdinaryBody", [
            ("model", Literal[models]), ("stream", Literal[False] | None, None),
            ("openrelay", msgspec.UnsetType, _UNSET), ("tool_config", msgspec.UnsetType, _UNSET),
            *((name, _MaybeRaw, _UNSET) for name in prompt_fields)], gc=False)
        # gc=False: they hold strings and raw bytes only, never a cycle, so the collector need not track the
        # 50,000 of a big input (which makes them cheaper to make and to free).
        record = msgspec.defstruct("Ordinary", [
            ("custom_id", Annotated[str, msgspec.Meta(min_length=1)]), ("method", Literal["POST"]),
            ("url", Literal[endpoint]), ("body", body)], forbid_unknown_fields=True, gc=False)
        decode = _ordinary_decoders[key] = msgspec.json.Decoder(record)
    return decode


class _NoRecord:
    """The decoder of an endpoint no model is offered for: no record is ordinary."""

    def decode(self, raw: bytes) -> Any:
        raise msgspec.ValidationError("no model is offered for this endpoint")

    decode_lines = decode


_NO_RECORD = _NoRecord()


class _Whole(msgspec.Struct, forbid_unknown_fields=True):
    """The ordinary record read whole: every number and string of its body decoded, so checked."""

    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


class _PromptBody(msgspec.Struct):
    messages: _MaybeRaw = _UNSET
    prompt: _MaybeRaw = _UNSET
    instructions: _MaybeRaw = _UNSET
    input: _MaybeRaw = _UNSET


class _PromptRecord(msgspec.Struct):
    body: _PromptBody | None = None


decode_whole = msgspec.json.Decoder(_Whole).decode
_decode_prompt_record = msgspec.json.Decoder(_PromptRecord).decode


def decode_prompt(raw: bytes, fields: tuple[str, ...]) -> bytes | None:
    """The prompt material of a record's line (the raw bytes of ``fields`` of its body, in order), for a record
    that is not ordinary; None when it has none or cannot be read this way."""
    try:
        body = _decode_prompt_record(raw).body
    except (msgspec.DecodeError, RecursionError):
        return None
    if body is None:
        return None
    parts = [bytes(part) for part in (getattr(body, name) for name in fields) if part is not _UNSET]
    return b"".join(parts) if parts else None


class NumberGate:
    """Which lines of a block could hold a number outside the float range, found for the whole block at once.

    Such a number has at least 309 digits before its decimal point, counting its exponent: so either an exponent
    of three digits or more (``1e400``, ``1.5E+999``, ``1e0400``), or, with at most two, a run of at least 210
    digits. Every exponent follows a digit, so the gate looks for a digit, ``e`` or ``E``, an optional sign and
    three digits; and for runs, at every 105th byte (a run of 210 covers two of them). What it finds is a line to
    read whole; nothing else can hold such a number. Digits in strings are found too, costing a whole read.
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



def cut_custom_id(custom_id: str) -> str:
    """The custom_id as shown in rejections: at most 512 escaped bytes, else a 509-byte prefix and ``...``."""
    if len(custom_id) * 6 <= CUSTOM_ID_LIMIT or _escaped_len(custom_id) <= CUSTOM_ID_LIMIT:
        return custom_id
    budget = CUSTOM_ID_LIMIT - 3
    used = 0
    for i, ch in enumerate(custom_id):
        used += _escaped_len(ch)
        if used > budget:
            return custom_id[:i] + "..."
    return custom_id


def _escaped_len(text: str) -> int:
    return len(orjson.dumps(text)) - 2


def _fail(custom_id: str, code: str, message: str) -> Verdict:
    return Verdict(custom_id=custom_id, code=code, message=message, model=None)


def check_record(record: Any, *, endpoint: str, catalog: Catalog) -> Verdict:
    """Judge one parsed record on every rule that needs nothing but the record itself."""
    if not isinstance(record, dict):
        return _fail("", "invalid_json", "record is not a JSON object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _fail("", "missing_custom_id", "custom_id is required and must be a non-empty string")
    method = record.get("method")
    if method != "POST":
        return _fail(custom_id, "invalid_method", f'method must be "POST" (got {_show(method)})')
    url = record.get("url")
    if url != endpoint:
        return _fail(custom_id, "url_mismatch", f'url {_show(url)} does not match the batch endpoint "{endpoint}"')
    body = record.get("body")
    if not isinstance(body, dict):
        return _fail(custom_id, "invalid_body", "body is required and must be a JSON object")
    if body.get("stream") is True:
        return _fail(custom_id, "streaming_unsupported", '"stream": true is not supported in batch')
    if "tool_config" in body or "tool_config" in record:
        return _fail(custom_id, "tool_config_moved",
                     "tool_config has moved: put it under body.openrelay.tool_config")
    if "openrelay" in body:
        problem = _extension_problem(body["openrelay"], catalog, endpoint)
        if problem is not None:
            return _fail(custom_id, *problem)
    model = body.get("model")
    if not isinstance(model, str):
        return _fail(custom_id, "missing_model", "body.model is required and must be a string")
    spec = catalog.models.get(model)
    if spec is None:
        offered = ", ".join(catalog.names())
        return _fail(custom_id, "model_not_offered",
                     f'model "{model}" is not offered for batch (offered: {offered})')
    if endpoint not in spec.endpoints:
        return _fail(custom_id, "model_endpoint_mismatch",
                     f'model "{model}" is not offered for {endpoint} (it serves: {", ".join(spec.endpoints)})')
    return Verdict(custom_id=custom_id, code=None, message=None, model=model)


def _extension_problem(ext: Any, catalog: Catalog, endpoint: str) -> tuple[str, str] | None:
    if not isinstance(ext, dict):
        return "unknown_extension", "body.openrelay must be a JSON object"
    unknown = sorted(k for k in ext if k != "tool_config")
    if unknown:
        return "unknown_extension", f'unknown openrelay extension "{unknown[0]}" (supported: tool_config)'
    if "tool_config" in ext:
        problem = tool_config_problem(ext["tool_config"], catalog, endpoint)
        if problem is not None:
            return "invalid_tool_config", problem
    return None


def _show(value: Any) -> str:
    """``value`` as JSON, cut to 100 characters, for a message."""
    if value is None:
        return "none"
    try:
        return orjson.dumps(value).decode()[:100]
    except orjson.JSONEncodeError:  # nested past orjson's 254 levels, or an integer past 64 bits
        pass
    try:
        return msgspec.json.encode(value).decode()[:100]
    except (msgspec.EncodeError, RecursionError, TypeError, ValueError):  # nested past msgspec's depth too
        return "a deeply nested JSON " + ("array" if isinstance(value, list) else "object")
