"""The create's fast path (msgspec shape decode) must judge every line exactly as the full rules do.

A reference judge built from ``parse_line`` + ``check_record`` alone (no fast path) is compared with
``scan_records`` on edge cases and on thousands of generated variations of a record.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

from openrelay.catalog import parse_catalog
from openrelay.validation.records import ParseFailure, check_record, cut_custom_id, parse_line
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
        verdict = check_record(record, endpoint=EP, catalog=CATALOG)
        if not verdict.custom_id:
            rejections.append((line, "", verdict.code, verdict.message))
            continue
        counts[verdict.custom_id] = counts.get(verdict.custom_id, 0) + 1
        judged.append((line, verdict.custom_id, verdict.code, verdict.message, verdict.model))
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


def scanned(lines: list[bytes], tmp_path) -> tuple[str | None, list[tuple[int, str, str, str]]]:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    def source():
        with open(path, "rb") as handle:
            yield from file_lines(handle, 1 << 20)

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
    orjson.dumps({"custom_id": "no-body", "method": "POST", "url": EP}),
    # What skipping does not check, the scan checks apart (records.NumberGate, UTF-8): numbers out of range
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
