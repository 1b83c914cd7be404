"""Input edges of a create (issue 10, parts 1, 2 and 7), over real HTTP to `orl serve`, on either store.

Numbers outside the float range are the record's ``invalid_json`` (in a file and inline alike, in Go's words)
while big integers pass; odd inline records that once answered 500 are judged like the same file lines; a
UTF-8 byte order mark is not part of the first record; an input with no records says so; an unknown top-level
field is refused by name; ids and filters holding NUL are unknown, not a database error.
"""

from __future__ import annotations

import socket
from typing import Any

import httpx
import orjson

from tests.support.batches import (
    BLANK,
    CHAT,
    ENVELOPE_KEYS,
    batch_ids,
    chat,
    error_of,
    file_ids,
    jsonl,
    post_batch,
    post_batch_from,
    upload,
)

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

BOM = b"\xef\xbb\xbf"
RANGE = "json: cannot unmarshal number {} into Go value of type float64"
NO_RECORDS = "the input has no records"


def _with_number(custom_id: str, number: bytes, where: str = "body") -> bytes:
    """A chat record's line with a number token written into it as it is (no serializer writes ``1e400``)."""
    line = orjson.dumps(chat(custom_id))
    if where == "body":
        return line.replace(b'"model":', b'"max_tokens":' + number + b',"model":', 1)
    return line[:-1] + b',"n":[' + number + b"]}"


def _inline(*raw_requests: bytes, **fields: Any) -> bytes:
    """A create's body whose ``requests`` are these raw lines, byte for byte."""
    head = {"endpoint": CHAT, "completion_window": "24h", **fields}
    return orjson.dumps(head)[:-1] + b',"requests":[' + b",".join(raw_requests) + b"]}"


def _post_raw(server, body: bytes, client: httpx.Client | None = None, **headers: str) -> httpx.Response:
    send = client.post if client is not None else httpx.post
    return send(server.base_url + "/batches", content=body, timeout=60,
                headers={"authorization": f"Bearer {server.api_key}", "content-type": "application/json", **headers})


def _rejections(resp: httpx.Response) -> list[tuple[int, str, str, str]]:
    body = resp.json()
    found = body["rejected_records"] if resp.status_code == 200 else body["error"]["rejected_records"]
    return [(r["line"], r["custom_id"], r["code"], r["message"]) for r in found]


def test_numbers_outside_the_float_range_are_invalid_json_in_a_file_and_inline(server):
    lines = [
        _with_number("huge", b"1e400"),
        _with_number("negative", b"-1e400"),
        _with_number("just-past", b"1e309"),
        _with_number("top-level", b"1.5E+999", where="record"),
        _with_number("long-float", b"1" + b"0" * 400 + b".5"),
        # These pass: an underflow is 0, and integers keep every digit whatever their size.
        _with_number("tiny", b"1e-400"),
        _with_number("big-int", b"123456789012345678901234567890"),
        _with_number("huge-int", b"1" + b"0" * 400),
        _with_number("largest", b"1.7976931348623157e308"),
    ]
    expected = [
        (1, "", "invalid_json", RANGE.format("1e400")),
        (2, "", "invalid_json", RANGE.format("-1e400")),
        (3, "", "invalid_json", RANGE.format("1e309")),
        (4, "", "invalid_json", RANGE.format("1.5E+999")),
        (5, "", "invalid_json", RANGE.format("1" + "0" * 60 + "...")),
    ]
    from_file = post_batch_from(server, jsonl(*lines))
    assert from_file.status_code == 200, from_file.text
    assert _rejections(from_file) == expected
    assert from_file.json()["request_counts"] == {"total": 9, "completed": 0, "failed": 5}

    inline = _post_raw(server, _inline(*lines))
    assert inline.status_code == 200, inline.text
    assert _rejections(inline) == expected
    # The stored inline input keeps each request's bytes, big integers included.
    stored = server.http("GET", f"/files/{inline.json()['input_file_id']}/content")
    assert stored.content == jsonl(*lines)

    # Only such records: the create is refused as a whole, each named.
    refused = _post_raw(server, _inline(lines[0], lines[3]))
    error_of(refused, 400, "no_valid_records")
    assert _rejections(refused) == [expected[0], (2, "", "invalid_json", RANGE.format("1.5E+999"))]


def test_odd_inline_records_are_judged_like_file_lines_on_one_connection(server):
    deep_body = b'{"custom_id":"deep","method":"POST","url":"/v1/chat/completions","body":{"model":"test/echo",' \
                b'"x":' + b"[" * 300 + b"1" + b"]" * 300 + b"}}"
    deep_method = b'{"custom_id":"deep-method","method":' + b"[" * 300 + b"]" * 300 + \
                  b',"url":"/v1/chat/completions","body":{"model":"test/echo"}}'
    too_deep = b'{"custom_id":"too-deep","method":"POST","url":"/v1/chat/completions","body":{"model":"test/echo",' \
               b'"x":' + b"[" * 2000 + b"]" * 2000 + b"}}"
    lines = [
        orjson.dumps(chat("model-list", model=["test/echo"])),
        orjson.dumps(chat("model-object", model={"name": "test/echo"})),
        deep_body,
        deep_method,
        orjson.dumps(chat("ok")),
    ]
    expected = [
        (1, "model-list", "missing_model", "body.model is required and must be a string"),
        (2, "model-object", "missing_model", "body.model is required and must be a string"),
        (4, "deep-method", "invalid_method", 'method must be "POST" (got ' + "[" * 100 + ")"),
    ]
    with httpx.Client(limits=httpx.Limits(max_connections=1)) as client:
        ports = set()
        for body in (_inline(*lines), _inline(lines[0]), _inline(lines[1]), _inline(deep_method)):
            resp = _post_raw(server, body, client=client)
            assert resp.status_code in (200, 400), resp.text
            assert resp.headers["content-type"].startswith("application/json")
            sock: socket.socket = resp.extensions["network_stream"].get_extra_info("socket")
            ports.add(sock.getsockname()[1])
        assert len(ports) == 1  # every answer came back on the one keep-alive connection
    inline = _post_raw(server, _inline(*lines))
    assert inline.status_code == 200, inline.text
    assert _rejections(inline) == expected
    from_file = post_batch_from(server, jsonl(*lines))
    assert from_file.status_code == 200, from_file.text
    assert _rejections(from_file) == expected

    # Nesting past the parsers' 1024 levels: in a file that line's invalid_json, in Go's words for the limit;
    # inline the body as a whole cannot be read.
    resp = post_batch_from(server, jsonl(too_deep, orjson.dumps(chat("ok"))))
    assert resp.status_code == 200, resp.text
    assert _rejections(resp) == [(1, "", "invalid_json", "invalid character '[' exceeded max depth")]
    error = error_of(_post_raw(server, _inline(too_deep)), 400, "invalid_request_error")
    assert error["message"].startswith("request body is not valid JSON")


def test_a_byte_order_mark_is_not_part_of_the_first_record(server):
    content = BOM + jsonl(chat("first"), BLANK, b"{oops", chat("second"))
    resp = post_batch_from(server, content)
    assert resp.status_code == 200, resp.text
    # Line numbers are unchanged: the bad line is still line 3.
    assert _rejections(resp) == [(3, "", "invalid_json", "invalid character 'o' looking for beginning of "
                                                         "object key string")]
    assert resp.json()["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
    # The worker reads the input the same way: the first record runs.
    batch = server.wait(resp.json()["id"])
    assert batch["status"] == "completed", batch
    output = server.http("GET", f"/files/{batch['output_file_id']}/content")
    assert sorted(orjson.loads(raw)["custom_id"] for raw in output.content.splitlines()) == ["first", "second"]
    # A mark anywhere else is the record's own bytes, refused as Go refuses it.
    resp = post_batch_from(server, jsonl(chat("a"), BOM + orjson.dumps(chat("b"))))
    assert _rejections(resp) == [(2, "", "invalid_json", "invalid character 'ï' looking for beginning of value")]


def test_an_input_with_no_records_says_so(server):
    before = set(batch_ids(server))
    for content in (b"", b"\n\n\n", b"  \n\t\n", BOM, BOM + b"\n\n"):
        error = error_of(post_batch_from(server, content), 400, "no_valid_records")
        assert error["message"] == NO_RECORDS, content
        assert set(error) == ENVELOPE_KEYS | {"rejected_records", "rejected_records_file_id", "rejected_count",
                                              "request_counts"}
        assert error["rejected_records"] == [] and error["rejected_count"] == 0
        assert error["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
        rejections = server.http("GET", f"/files/{error['rejected_records_file_id']}/content")
        assert rejections.status_code == 200 and rejections.content == b""
    assert set(batch_ids(server)) == before
    # One record, rejected, still counts as a record.
    error = error_of(post_batch_from(server, jsonl(BLANK, b"{oops")), 400, "no_valid_records")
    assert error["message"] == "all 1 records were rejected; see rejected_records"


def test_an_unknown_top_level_field_is_refused_by_name(server):
    file_id = upload(server, jsonl(chat("req-1")))
    files = file_ids(server)

    def refused(param: str, **fields: Any) -> dict[str, Any]:
        return error_of(post_batch(server, **fields), 400, "invalid_request_error", param=param)

    error = refused("completion_windows", input_file_id=file_id, completion_windows="24h")
    assert error["message"] == "Unrecognized request argument supplied: completion_windows"
    # The first unknown field in the request is named, before any other field is judged.
    error = refused("inputs", requests=[chat("a")], inputs=[], dry=True, endpoint="/v1/nope")
    assert error["message"] == "Unrecognized request argument supplied: inputs"
    error = refused("x" * 253 + "...", requests=[chat("a")], **{"x" * 1000: 1})
    assert error["message"] == "Unrecognized request argument supplied: " + "x" * 253 + "..."
    # output_expires_after is taken as OpenAI takes it: outside its range, a 400 naming the field
    # (tests/test_expiry.py).
    error = refused("output_expires_after.seconds", input_file_id=file_id,
                    output_expires_after={"anchor": "created_at", "seconds": 60})
    assert "3600" in error["message"]
    assert batch_ids(server) == [] and file_ids(server) == files

    # Step 4 (the feature switch) comes before it.
    assert server.admin("org", "set", server.org, "--expedited", "off").returncode == 0
    error_of(post_batch(server, input_file_id=file_id, priority="expedited", completion_windows="24h"), 409,
             "feature_disabled")
    assert server.admin("org", "set", server.org, "--expedited", "on").returncode == 0

    # The SDK's own fields pass: metadata, and a null one.
    client = server.client()
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h",
                                  metadata={"job": "sdk"})
    assert batch.metadata == {"job": "sdk"}
    resp = post_batch(server, input_file_id=file_id, metadata=None, priority="standard")
    assert resp.status_code == 200, resp.text


def test_ids_and_filters_holding_nul_are_unknown(server):
    file_id = upload(server, jsonl(chat("req-1")))
    batch = post_batch(server, input_file_id=file_id)
    assert batch.status_code == 200, batch.text

    def unknown(resp: httpx.Response, param: str) -> None:
        error = error_of(resp, 404, "not_found", param=param)
        assert error["message"].endswith(": \x00x")

    unknown(server.http("GET", "/batches/%00x"), "batch_id")
    unknown(server.http("POST", "/batches/%00x/cancel"), "batch_id")
    unknown(server.http("POST", "/batches/%00x/metadata", json={"metadata": {}}), "batch_id")
    unknown(server.http("GET", "/files/%00x"), "file_id")
    unknown(server.http("GET", "/files/%00x/content"), "file_id")
    unknown(server.http("DELETE", "/files/%00x"), "file_id")
    unknown(server.http("GET", "/batches", params={"after": "\x00x"}), "after")
    unknown(server.http("GET", "/files", params={"after": "\x00x"}), "after")
    unknown(post_batch(server, input_file_id="\x00x"), "file_id")
    for params in ({"model": "\x00"}, {"tag": "a\x00"}):
        resp = server.http("GET", "/batches", params=params)
        assert resp.status_code == 200 and resp.json()["data"] == [], resp.text
    resp = server.http("GET", "/files", params={"purpose": "batch\x00"})
    assert resp.status_code == 200 and resp.json()["data"] == [], resp.text
    # Metadata values may hold NUL: they are stored as JSON text, escaped.
    resp = server.http("POST", f"/batches/{batch.json()['id']}/metadata", json={"metadata": {"k": "a\x00b"}})
    assert resp.status_code == 200 and resp.json()["metadata"] == {"k": "a\x00b"}, resp.text
    # A file name the store cannot keep is a 400, and nothing is stored (the batch has ended: its output file is
    # among the files before).
    server.wait(batch.json()["id"])
    files = file_ids(server)
    for name in (b"a\x00b.jsonl", b"n" * 513):
        resp = server.http("POST", "/files", content=_form(name), headers={
            "content-type": "multipart/form-data; boundary=XyZ"})
        error_of(resp, 400, "invalid_request_error", param="file")
    assert file_ids(server) == files


def _form(filename: bytes) -> bytes:
    """A multipart upload written by hand: httpx would percent-encode a NUL in the file name."""
    return (b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="' + filename + b'"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n{}\n\r\n--XyZ--\r\n")
