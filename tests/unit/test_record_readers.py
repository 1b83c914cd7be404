"""The create's rules are written once (``rules.check_record``), over a record read one of two ways: by msgspec,
skipping what the rules do not read (``records.read_record``, what the scan mostly does), or parsed whole
(``records.record_of(parse_line(...))``). Every line must be judged alike both ways.

A reference judge built from the whole parse alone is compared with ``scan_records`` on edge cases, on thousands
of generated variations of a record, and on lines Hypothesis makes.
"""

from __future__ import annotations

import io
import random
from typing import Any

import msgspec
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from openrelay.catalog import parse_catalog
from openrelay.errors import InputRefused
from openrelay.validation.records import RULE_FIELDS, ParseFailure, Record, parse_line, read_record, record_of
from openrelay.validation.rules import WORKFLOW, check_record, cut_custom_id
from openrelay.validation.scan import DUPLICATE_MESSAGE, file_lines, scan_records

CATALOG = parse_catalog("""
[[models]]
name = "m/chat"
endpoints = ["/v1/chat/completions"]
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }

[[models]]
name = "m/other"
endpoints = ["/v1/chat/completions"]
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }

[[models]]
name = "m/embed"
endpoints = ["/v1/embeddings"]
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }
""")
EP = "/v1/chat/completions"


def reference(lines: list[bytes]) -> tuple[str | None, list[tuple[int, str, str, str]]]:
    """The rules of docs/api-contract.md §4 applied the slow, obvious way."""
    judged: list[tuple[int, str, str | None, str | None, str | None]] = []
    rejections = []
    counts: dict[str, int] = {}
    for line, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = parse_line(raw)
        except ParseFailure as exc:
            rejections.append((line, "", "invalid_json", str(exc)))
            continue
        custom_id, code, message, model = check_record(record_of(record), EP, CATALOG)
        if code == WORKFLOW:
            raise InputRefused(message or "", code=code)
        if not custom_id:
            rejections.append((line, "", code, message))
            continue
        counts[custom_id] = counts.get(custom_id, 0) + 1
        judged.append((line, custom_id, code, message, model))
    model = None
    for line, custom_id, code, message, record_model in judged:
        if counts[custom_id] > 1:
            code, message = "duplicate_custom_id", DUPLICATE_MESSAGE
        elif code is None:
            if model is None:
                model = record_model
            elif record_model != model:
                code = "model_mismatch"
                message = f'model "{record_model}" differs from the batch\'s model "{model}"'
        if code is not None:
            rejections.append((line, cut_custom_id(custom_id), code, message))
    return model, sorted(rejections)


def scanned(lines: list[bytes], tmp_path: Any = None) -> tuple[str | None, list[tuple[int, str, str, str]]]:
    data = b"\n".join(lines) + b"\n"

    def source():
        yield from file_lines(io.BytesIO(data), 1 << 20)

    result = scan_records(source, endpoint=EP, catalog=CATALOG, max_records=100_000)
    return result.model, [(r.line, r.custom_id, r.code, r.message) for r in result.rejections]


def record(custom_id: Any = "a", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": EP,
            "body": {"model": "m/chat", "messages": [{"role": "user", "content": "hi"}], **body}}


EDGE_LINES = [
    orjson.dumps(record("plain")),
    orjson.dumps(record("utf8", messages=[{"role": "user", "content": "héllo – ünïcode"}])),
    b'{"custom_id":"badutf8","method":"POST","url":"/v1/chat/completions","body":{"model":"m/chat","x":"\xff"}}',
    orjson.dumps(record("null-ext", openrelay=None)),
    orjson.dumps(record("stream-false", stream=False)),
    orjson.dumps(record("stream-true", stream=True)),
    orjson.dumps(record("stream-str", stream="yes")),
    orjson.dumps({**record("extra-top"), "note": "kept"}),
    b'{"custom_id":"first","custom_id":"dupkey","method":"POST","url":"/v1/chat/completions",'
    b'"body":{"model":"m/chat"}}',
    b'{"custom_id":"deep","method":"POST","url":"/v1/chat/completions","body":{"model":"m/chat","x":'
    + b"[" * 1100 + b"]" * 1100 + b"}}",
    orjson.dumps(record("tc", tool_config={"servers": []})),
    orjson.dumps(record("", )),
    orjson.dumps(record(7)),
    orjson.dumps(record("model-int", model=5)),
    orjson.dumps(record("embed-model", model="m/embed")),
    b"nope",
    b"[1, 2]",
    b"null",
    b'"a string"',
    orjson.dumps({"custom_id": "no-body", "method": "POST", "url": EP}),
    # What skipping does not check, the scan has parsed whole (records.NumberGate, UTF-8): numbers out of range
    # anywhere, in the prompt too, written every way; big integers and such digits in strings pass.
    orjson.dumps(record("exp-body", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":1e400'),
    orjson.dumps(record("exp-prompt")).replace(b'"content":"hi"', b'"content":"hi","n":[-1.5E+999]'),
    orjson.dumps(record("exp-zeros", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":1e0400'),
    orjson.dumps(record("long-mantissa", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":' + b"1" * 250
                                                               + b"e80"),
    orjson.dumps(record("long-fraction", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":1' + b"0" * 400
                                                               + b".5"),
    orjson.dumps(record("tiny", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":1e-400'),
    orjson.dumps(record("big-int", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":' + b"9" * 400),
    orjson.dumps(record("largest", max_tokens=1)).replace(b'"max_tokens":1', b'"max_tokens":1.7976931348623157e308'),
    orjson.dumps(record("in-string", messages=[{"role": "user", "content": "1e400 and " + "7" * 400}])),
    orjson.dumps(record("badutf8-prompt")).replace(b'"content":"hi"', b'"content":"h\xffi"'),
    orjson.dumps(record("stream-zero", stream=0)),
    orjson.dumps(record("stream-null", stream=None)),
    orjson.dumps(record("model-null", model=None)),
    orjson.dumps(record("method-lower")).replace(b'"POST"', b'"post"'),
    orjson.dumps({**record("tc-top"), "tool_config": {}}),
]


def test_edge_lines_judged_as_the_full_rules_judge_them(tmp_path):
    assert scanned(EDGE_LINES, tmp_path) == reference(EDGE_LINES)


NUMBER_TOKENS = [b"1e400", b"-1e309", b"2E+308", b"1e-400", b"9" * 330, b"1" + b"0" * 300 + b"e9", b"3.5e99", b"0"]


def test_generated_variations_match_the_full_rules(tmp_path):
    rng = random.Random(20261130)
    for _round in range(40):
        lines = []
        for _ in range(60):
            rec: dict[str, Any] = record(rng.choice(["a", "b", "c", "d", f"id-{rng.randrange(1000)}", "", 3]),
                                         model=rng.choice(["m/chat", "m/chat", "m/other", "m/embed", "nope", 1]))
            if rng.random() < 0.15:
                rec["method"] = rng.choice(["GET", None, "post"])
            if rng.random() < 0.15:
                rec["url"] = rng.choice(["/v1/embeddings", "/v1/chat/completions/", 5])
            if rng.random() < 0.1:
                rec["body"]["stream"] = rng.choice([True, False, None, "true"])
            if rng.random() < 0.1:
                rec["body"]["openrelay"] = rng.choice([None, {}, {"x": 1}, "s"])
            if rng.random() < 0.05:
                rec["extra"] = 1
            if rng.random() < 0.05:
                del rec[rng.choice(["custom_id", "method", "url", "body"])]
            raw = orjson.dumps(rec)
            if rng.random() < 0.1:  # a number token somewhere in the body or inside its messages
                where = rng.choice([b'"model":', b'"role":'])
                if where in raw:
                    raw = raw.replace(where, b'"x":' + rng.choice(NUMBER_TOKENS) + b"," + where, 1)
            if rng.random() < 0.05:
                raw = raw[: rng.randrange(len(raw))]
            lines.append(raw if rng.random() > 0.05 else b"")
        assert scanned(lines, tmp_path) == reference(lines)


# -- lines Hypothesis makes: every field the rules read, with values of every JSON type ---------------------------

KEYS = st.sampled_from([*Record.__struct_fields__, *RULE_FIELDS, "messages", "workflow", "x"]) | st.text(max_size=4)
# Integers within 64 bits: past them orjson (the whole parse) reads a float where msgspec keeps every digit, which
# only a message echoing a rejected value (``"method": 1e+30``) could show, and only for a line nested too deep
# for msgspec; the rewrites below put such integers where the rules do not look.
SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
           | st.sampled_from(["POST", EP, "m/chat", "m/embed", "a", ""]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=10)
# Spellings a serializer does not write: numbers out of range, big integers, keys and values with escapes.
REWRITES = [(b"", b""), (b'"custom_id"', b'"\\u0063ustom_id"'), (b'"stream":true', b'"str\\u0065am":true'),
            (b'"POST"', b'"P\\u004fST"'), (b':0', b':1e400'), (b'"messages":[]', b'"messages":[' + b'9' * 30 + b']'),
            (b':0', b':-0.0e-999')]


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A record with some of its fields (of the record and of its body) dropped or replaced by any JSON; or, now
    and then, any JSON value at all."""
    if draw(st.integers(0, 9)) == 0:
        return msgspec.json.encode(draw(JSON))
    body: dict[str, Any] = {"model": draw(st.sampled_from(["m/chat", "m/other", "m/embed"])), "messages": []}
    rec: dict[str, Any] = {"custom_id": draw(st.sampled_from(["a", "b"])), "method": "POST", "url": EP, "body": body}
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from([rec, body]))
        key = draw(KEYS)
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(JSON)
    raw = msgspec.json.encode(rec)
    old, new = draw(st.sampled_from(REWRITES))
    return raw.replace(old, new, 1)


def seen_by_rules(record: Any) -> Any:
    """What ``check_record`` can see of a record: the ``Record``'s fields, of its body only the rules' ones."""
    if not isinstance(record, Record):
        return record
    body = record.body
    if type(body).__name__ == "Body":
        body = {name: getattr(body, name) for name in RULE_FIELDS}
    return {**{name: getattr(record, name) for name in Record.__struct_fields__}, "body": body}


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(raw=lines())
def test_both_readers_give_the_rules_the_same_record(raw):
    """The rules see the same record whether msgspec read the line skipping the rest or it was parsed whole, and
    the scan's verdicts are the whole parse's. A rule cannot be written twice: ``check_record`` reads the fields
    of ``Record`` alone (a slotted struct: no other attribute exists), and both readers fill the same fields."""
    try:
        whole = record_of(parse_line(raw))
    except ParseFailure:
        whole = ParseFailure
    try:
        skipping = read_record(raw, whole=False)
    except ParseFailure:
        skipping = ParseFailure
    if not any(token in raw for token in (b"e400", b"e-999")):  # numbers the skipping read may not check
        assert seen_by_rules(skipping) == seen_by_rules(whole), raw
    assert refused(lambda: scanned([raw])) == refused(lambda: reference([raw])), raw


def refused(judge: Any) -> Any:
    """``judge()``, or the code of the whole-input refusal it raised."""
    try:
        return judge()
    except InputRefused as exc:
        return exc.code
