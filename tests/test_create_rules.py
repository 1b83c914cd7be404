"""Per-record rules of a create (docs/api-contract.md §3, §4, §6 and §12; the worked examples of §13), over HTTP.

Whole-create refusals (auth, scopes, budget, feature switch, fields, workflow, size) are in test_create_refusals.py.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from tests.support.batches import (
    BATCH_ID,
    BLANK,
    CHAT,
    EMBEDDINGS,
    FILE_ID,
    batch_ids,
    batch_usage,
    chat,
    embed,
    error_of,
    jsonl,
    line,
    lines_of,
    post_batch,
    post_batch_from,
    upload,
    without,
)
from tests.support.server import catalog_text

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

# docs/api-contract.md §6, every field of the batch object, and OpenRelay's `openrelay` object of live progress numbers
# (docs/progress-and-dry-run.md); the create answer adds the rejection fields.
BATCH_FIELDS = {
    "id", "object", "endpoint", "input_file_id", "completion_window", "priority", "status", "model", "created_at",
    "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
    "cancelled_at", "output_file_id", "error_file_id", "errors", "request_counts", "usage", "metadata", "openrelay",
    "failure_threshold",
}
CREATE_ONLY = {"rejected_count", "rejected_records", "rejected_records_file_id"}

# The wording docs/api-contract.md §13 gives exactly.
EXAMPLE_JSON_ERROR = "invalid character 'o' in literal null (expecting 'u')"
STREAMING = '"stream": true is not supported in batch'
DUPLICATE = "custom_id appears more than once"
OFFERED = "offered: test/echo, test/embed"

ALLOWED_TOOL = "http://127.0.0.1:9/mcp"
# The operator allows the metadata addresses too, so only the link-local rule can refuse them, an entry naming no
# path (as a string prefix it would cover other hosts too) and one on the default port.
BLOCKED_TOOLS = {"tc-metadata": "http://169.254.169.254/latest/meta-data", "tc-metadata-v6": "http://[fd00:ec2::254]/mcp",
                 "tc-metadata-gcp-v6": "http://[fd20:ce::254]/mcp", "tc-metadata-alibaba": "http://100.100.100.200/mcp",
                 "tc-nat64": "http://[64:ff9b::a9fe:a9fe]/mcp", "tc-6to4": "http://[2002:a9fe:a9fe::1]/mcp"}
METADATA_CATALOG_ALLOW = (ALLOWED_TOOL, *BLOCKED_TOOLS.values(), "https://tools.example.org", "http://127.0.0.1/tools")
BLOCKED = ("in", "points at a link-local or metadata address")
NOT_ALLOWED = ("in", "is not allowed by the operator")
USERINFO = ("in", "carries userinfo")
RESERVED_HEADER = ("in", "is set by OpenRelay's MCP client and may not be given")

ANY = object()  # the message is not fixed by the contract: any non-empty text


def _tools(url: str = ALLOWED_TOOL, **config: Any) -> dict[str, Any]:
    return {"tool_config": {"servers": [{"url": url}], **config}}


def _headers(**headers: str) -> dict[str, Any]:
    return {"tool_config": {"servers": [{"url": ALLOWED_TOOL, "headers": headers}]}}


def _stray_tool_config() -> dict[str, Any]:
    return {"servers": [{"url": ALLOWED_TOOL}]}


def _cases() -> list[tuple[Any, str, str | None, Any]]:
    """(record, custom_id shown, code or None when accepted, message or ANY or ("in", part))."""
    return [
        (chat("ok-1"), "ok-1", None, None),
        (without(chat("x"), "custom_id"), "", "missing_custom_id", ANY),
        (chat(""), "", "missing_custom_id", ANY),
        (chat(42), "", "missing_custom_id", ANY),
        (chat(None), "", "missing_custom_id", ANY),
        (chat(["a"]), "", "missing_custom_id", ANY),
        ({**chat("get"), "method": "GET"}, "get", "invalid_method", ANY),
        ({**chat("post-lower"), "method": "post"}, "post-lower", "invalid_method", ANY),
        (without(chat("no-method"), "method"), "no-method", "invalid_method", ANY),
        ({**chat("embed-url"), "url": EMBEDDINGS}, "embed-url", "url_mismatch", ANY),
        ({**chat("v1-less-url"), "url": "/chat/completions"}, "v1-less-url", "url_mismatch", ANY),
        (without(chat("no-url"), "url"), "no-url", "url_mismatch", ANY),
        (without(chat("no-body"), "body"), "no-body", "invalid_body", ANY),
        ({**chat("str-body"), "body": "hello"}, "str-body", "invalid_body", ANY),
        ({**chat("list-body"), "body": [{"model": "test/echo"}]}, "list-body", "invalid_body", ANY),
        (chat("stream", stream=True), "stream", "streaming_unsupported", STREAMING),
        (chat("stream-false", stream=False), "stream-false", None, None),
        (chat("moved-body", tool_config=_stray_tool_config()), "moved-body", "tool_config_moved",
         ("in", "body.openrelay.tool_config")),
        ({**chat("moved-top"), "tool_config": _stray_tool_config()}, "moved-top", "tool_config_moved",
         ("in", "body.openrelay.tool_config")),
        (chat("ext-str", openrelay="tool_config"), "ext-str", "unknown_extension", ANY),
        (chat("ext-null", openrelay=None), "ext-null", "unknown_extension", ANY),
        (chat("ext-list", openrelay=[_tools()]), "ext-list", "unknown_extension", ANY),
        (chat("ext-key", openrelay={**_tools(), "cache": True}), "ext-key", "unknown_extension", ANY),
        (chat("tc-list", openrelay={"tool_config": [_stray_tool_config()]}), "tc-list", "invalid_tool_config", ANY),
        (chat("tc-servers-str", openrelay={"tool_config": {"servers": ALLOWED_TOOL}}), "tc-servers-str",
         "invalid_tool_config", ANY),
        (chat("tc-no-servers", openrelay={"tool_config": {"servers": []}}), "tc-no-servers",
         "invalid_tool_config", ANY),
        (chat("tc-server-str", openrelay={"tool_config": {"servers": [ALLOWED_TOOL]}}), "tc-server-str",
         "invalid_tool_config", ANY),
        (chat("tc-elsewhere", openrelay=_tools("https://tools.example.com/mcp")), "tc-elsewhere",
         "invalid_tool_config", ANY),
        (chat("tc-other-path", openrelay=_tools("http://127.0.0.1:9/other")), "tc-other-path",
         "invalid_tool_config", ANY),
        (chat("tc-rounds-0", openrelay=_tools(max_rounds=0)), "tc-rounds-0", "invalid_tool_config", ANY),
        (chat("tc-rounds-17", openrelay=_tools(max_rounds=17)), "tc-rounds-17", "invalid_tool_config", ANY),
        (chat("tc-rounds-str", openrelay=_tools(max_rounds="8")), "tc-rounds-str", "invalid_tool_config", ANY),
        (chat("tc-rounds-float", openrelay=_tools(max_rounds=2.5)), "tc-rounds-float", "invalid_tool_config", ANY),
        *((chat(cid, openrelay=_tools(url)), cid, "invalid_tool_config", BLOCKED)
          for cid, url in BLOCKED_TOOLS.items()),
        # Allow entries match by scheme, host, port and path, never as a string prefix.
        (chat("tc-host-suffix", openrelay=_tools("https://tools.example.org.evil.net/mcp")), "tc-host-suffix",
         "invalid_tool_config", NOT_ALLOWED),
        (chat("tc-userinfo-port", openrelay=_tools("https://tools.example.org:1@evil.net/mcp")), "tc-userinfo-port",
         "invalid_tool_config", USERINFO),
        (chat("tc-userinfo", openrelay=_tools("https://me:pw@tools.example.org/mcp")), "tc-userinfo",
         "invalid_tool_config", USERINFO),
        (chat("tc-other-port", openrelay=_tools("https://tools.example.org:8443/mcp")), "tc-other-port",
         "invalid_tool_config", NOT_ALLOWED),
        (chat("tc-other-scheme", openrelay=_tools("http://tools.example.org/mcp")), "tc-other-scheme",
         "invalid_tool_config", NOT_ALLOWED),
        (chat("tc-path-sibling", openrelay=_tools("http://127.0.0.1/toolsx/mcp")), "tc-path-sibling",
         "invalid_tool_config", NOT_ALLOWED),
        (chat("tc-backslash", openrelay=_tools("https://tools.example.org\\.evil.net/mcp")), "tc-backslash",
         "invalid_tool_config", NOT_ALLOWED),
        (chat("tc-ok-default-port", openrelay=_tools("http://127.0.0.1:80/tools/mcp")), "tc-ok-default-port",
         None, None),
        # Header names are HTTP tokens, values visible ASCII; the client's own headers cannot be replaced.
        (chat("tc-header-utf8", openrelay=_headers(Authorization="Bearer café")), "tc-header-utf8",
         "invalid_tool_config", ("in", "visible ASCII")),
        (chat("tc-header-crlf", openrelay=_headers(x_token="t\r\nHost: internal")), "tc-header-crlf",
         "invalid_tool_config", ("in", "visible ASCII")),
        (chat("tc-header-name", openrelay=_headers(**{"x token": "t"})), "tc-header-name", "invalid_tool_config",
         ("in", "not a valid HTTP header name")),
        *((chat(f"tc-header-{name}", openrelay=_headers(**{name: "x"})), f"tc-header-{name}", "invalid_tool_config",
           RESERVED_HEADER) for name in ("Host", "content-length", "Transfer-Encoding", "Connection", "Content-Type",
                                          "ACCEPT", "Mcp-Session-Id", "mcp-protocol-version")),
        (chat("tc-ok-headers", openrelay=_headers(Authorization="Bearer t0k3n", **{"X-Api-Key": "a b\tc~!"})),
         "tc-ok-headers", None, None),
        (chat("tc-ok-16", openrelay=_tools(max_rounds=16)), "tc-ok-16", None, None),
        (chat("tc-ok-1", openrelay={"tool_config": {"max_rounds": 1, "servers": [
            {"url": ALLOWED_TOOL, "headers": {"x-token": "t"}, "allowed_tools": ["search"]}]}}), "tc-ok-1", None, None),
        (without(chat("no-model"), "body", "model"), "no-model", "missing_model", ANY),
        (chat("num-model", model=7), "num-model", "missing_model", ANY),
        (chat("null-model", model=None), "null-model", "missing_model", ANY),
        (chat("unknown-model", model="openrelay/unknown"), "unknown-model", "model_not_offered",
         f'model "openrelay/unknown" is not offered for batch ({OFFERED})'),
        (chat("embed-model", model="test/embed"), "embed-model", "model_endpoint_mismatch", ANY),
        (chat("ok-2"), "ok-2", None, None),
    ]


def _check_rejections(got: list[dict[str, Any]], expected: list[tuple[int, str, str, Any]]) -> None:
    assert [(r["line"], r["custom_id"], r["code"]) for r in got] == [e[:3] for e in expected]
    for rejection, (_line, _cid, _code, message) in zip(got, expected, strict=True):
        assert set(rejection) == {"line", "custom_id", "code", "message"}
        assert isinstance(rejection["message"], str) and rejection["message"], rejection
        if isinstance(message, str):
            assert rejection["message"] == message, rejection
        elif isinstance(message, tuple):
            assert message[1] in rejection["message"], rejection


def _metadata_server(make_server, engine_url):
    return make_server(catalog=catalog_text(engine_url, tools=METADATA_CATALOG_ALLOW))


def test_every_record_rule_in_a_file_and_inline(make_server, engine_url):
    server = _metadata_server(make_server, engine_url)
    # Lines that cannot be read as a record: the parser's words (Go's encoding/json), custom_id "".
    unreadable = [
        (b'{"custom_id": "seed", "method": no}', EXAMPLE_JSON_ERROR),
        (b'{"custom_id": "comma",}', "invalid character '}' looking for beginning of object key string"),
        (b'{"custom_id": "short"', "unexpected end of JSON input"),
        (b"{'custom_id': 'single'}", "invalid character '\\'' looking for beginning of object key string"),
        (line(chat("after")) + b" x", "invalid character 'x' after top-level value"),
        (line(chat("bad-utf8-\xff")).replace("\xff".encode(), b"\xff"), ANY),  # a lone 0xff byte
        (b"[1, 2]", ANY),
        (b'"a string"', ANY),
        (b"null", ANY),
    ]
    items: list[bytes] = [BLANK]  # the first line is blank: the first record is line 2
    expected: list[tuple[int, str, str, Any]] = []
    records = 0
    for raw, message in unreadable:
        items.append(raw)
        records += 1
        expected.append((len(items), "", "invalid_json", message))
    for n, (record, custom_id, code, message) in enumerate(_cases()):
        if n % 5 == 0:
            items.append(b"   \t" if n % 2 else BLANK)  # blank and whitespace-only lines count, are no record
        items.append(line(record) + (b"\r" if n % 7 == 0 else b""))  # CRLF line endings read the same
        records += 1
        if code is not None:
            expected.append((len(items), custom_id, code, message))
    items.append(BLANK)

    resp = post_batch_from(server, jsonl(*items))
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    _check_rejections(batch["rejected_records"], expected)
    assert batch["rejected_count"] == len(expected)
    assert batch["request_counts"] == {"total": records, "completed": 0, "failed": len(expected)}
    assert batch["model"] == "test/echo"
    assert batch["status"] == "validating"
    # The rejections file holds the very same objects, readable at once.
    assert lines_of(server, batch["rejected_records_file_id"]) == batch["rejected_records"]

    # The same rules inline, where line is the position in requests, from 1.
    requests: list[Any] = []
    expected = []
    for record, custom_id, code, message in [
        ([1, 2], "", "invalid_json", ANY),
        ("a string", "", "invalid_json", ANY),
        (None, "", "invalid_json", ANY),
        (7, "", "invalid_json", ANY),
        *_cases(),
    ]:
        requests.append(record)
        if code is not None:
            expected.append((len(requests), custom_id, code, message))
    resp = post_batch(server, requests=requests)
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    _check_rejections(batch["rejected_records"], expected)
    assert batch["rejected_count"] == len(expected)
    assert batch["request_counts"] == {"total": len(requests), "completed": 0, "failed": len(expected)}
    assert lines_of(server, batch["rejected_records_file_id"]) == batch["rejected_records"]


def test_duplicates_reject_every_occurrence_and_land_in_the_error_file(server, engine):
    items = [
        chat("dup-a", text="first"),  # 1
        chat("ok-1", text="one"),  # 2
        chat("dup-a", stream=True),  # 3: the duplicate rule wins over streaming
        BLANK,  # 4
        {**chat("dup-b"), "method": "GET"},  # 5: ... and over invalid_method
        chat("dup-b", model="openrelay/unknown"),  # 6: ... and over model_not_offered
        b'{"custom_id": "dup-a", "method": no}',  # 7: unreadable, so it names no custom_id
        chat("dup-a", text="third"),  # 8
        chat(""),  # 9: two records without a custom_id are no duplicates of each other
        chat(""),  # 10
        chat("ok-2", text="two"),  # 11
        {**chat("dup-c"), "tool_config": _stray_tool_config()},  # 12
        chat("dup-c", model="test/embed"),  # 13
    ]
    resp = post_batch_from(server, jsonl(*items))
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    expected = [
        (1, "dup-a", "duplicate_custom_id", DUPLICATE),
        (3, "dup-a", "duplicate_custom_id", DUPLICATE),
        (5, "dup-b", "duplicate_custom_id", DUPLICATE),
        (6, "dup-b", "duplicate_custom_id", DUPLICATE),
        (7, "", "invalid_json", EXAMPLE_JSON_ERROR),
        (8, "dup-a", "duplicate_custom_id", DUPLICATE),
        (9, "", "missing_custom_id", ANY),
        (10, "", "missing_custom_id", ANY),
        (12, "dup-c", "duplicate_custom_id", DUPLICATE),
        (13, "dup-c", "duplicate_custom_id", DUPLICATE),
    ]
    _check_rejections(batch["rejected_records"], expected)
    assert batch["rejected_count"] == 10
    assert batch["request_counts"] == {"total": 12, "completed": 0, "failed": 10}

    done = server.wait(batch["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 12, "completed": 2, "failed": 10}
    # None of the duplicates ran: only ok-1 and ok-2 reached the engine and the output file.
    assert sorted(r["body"]["messages"][0]["content"] for r in engine.requests()) == ["one", "two"]
    output = lines_of(server, done["output_file_id"])
    assert sorted(r["custom_id"] for r in output) == ["ok-1", "ok-2"]
    errors = lines_of(server, done["error_file_id"])
    by_message = sorted(errors, key=lambda r: int(r["error"]["message"].split(":")[0].removeprefix("line ")))
    assert len(by_message) == len(expected)
    for got, rejection in zip(by_message, batch["rejected_records"], strict=True):
        cid = rejection["custom_id"]
        assert got == {"id": f"batch_req_{cid}", "custom_id": cid, "response": None,
                       "error": {"code": rejection["code"],
                                 "message": f"line {rejection['line']}: {rejection['message']}"}}


def test_batch_model_is_the_first_record_passing_every_rule(server):
    items = [
        embed("e-1", model="test/embed", stream=True),  # 1: rejected, names no batch model
        BLANK,  # 2
        embed("e-3", model="test/embed"),  # 3: a duplicate (with line 6), so not the batch's model
        embed("e-4", model="openrelay/unknown"),  # 4
        embed("e-5", model="test/echo"),  # 5: the first record passing every rule
        embed("e-3", model="test/embed"),  # 6
        embed("e-7", model="test/embed"),  # 7: another model than the batch's
        embed("e-8", model="test/echo"),  # 8
        embed("e-9", model="test/embed", openrelay={"workflows": {}}),  # 9: unknown_extension, not mismatch
    ]
    resp = post_batch_from(server, jsonl(*items), endpoint=EMBEDDINGS)
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    assert batch["model"] == "test/echo"
    _check_rejections(batch["rejected_records"], [
        (1, "e-1", "streaming_unsupported", STREAMING),
        (3, "e-3", "duplicate_custom_id", DUPLICATE),
        (4, "e-4", "model_not_offered", f'model "openrelay/unknown" is not offered for batch ({OFFERED})'),
        (6, "e-3", "duplicate_custom_id", DUPLICATE),
        (7, "e-7", "model_mismatch", ANY),
        (9, "e-9", "unknown_extension", ANY),
    ])
    assert batch["request_counts"] == {"total": 8, "completed": 0, "failed": 6}

    # Inline, the same rule by position; test/embed decides here.
    resp = post_batch(server, endpoint=EMBEDDINGS, requests=[
        embed("i-1", model="test/echo", stream=True),
        embed("i-2", model="test/embed"),
        embed("i-3", model="test/echo"),
        embed("i-4", model="test/embed"),
    ])
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    assert batch["model"] == "test/embed"
    _check_rejections(batch["rejected_records"], [
        (1, "i-1", "streaming_unsupported", STREAMING),
        (3, "i-3", "model_mismatch", ANY),
    ])
    assert batch["request_counts"] == {"total": 4, "completed": 0, "failed": 2}


def test_long_custom_ids_are_cut_to_512_escaped_bytes(server, engine):
    def escaped(text: str) -> int:
        return len(orjson.dumps(text)) - 2

    # (custom_id, what the rejection shows)
    cases = [
        ("a" * 512, "a" * 512),  # exactly 512 bytes: shown whole
        ("b" * 513, "b" * 509 + "..."),
        ('"' * 300, '"' * 254 + "..."),  # each quote escapes to 2 bytes
        ("c" + '"' * 255, "c" + '"' * 255),  # 511 escaped bytes: whole
        ("d" * 508 + '"' * 3, "d" * 508 + "..."),  # 514: the first quote would pass 509
        ("\x01" * 100, "\x01" * 84 + "..."),  # a control character escapes to 6 bytes (\u0001)
        ("\n" * 300, "\n" * 254 + "..."),  # \n: 2 bytes
        ("e" * 505 + "\x02" + "e" * 10, "e" * 505 + "..."),  # 505 + 6 > 509
        ("f" * 503 + "\x02" + "f" * 10, "f" * 503 + "\x02" + "..."),  # 503 + 6 = 509 fits
    ]
    for cid, shown in cases:
        assert escaped(shown.removesuffix("...")) <= 509 or shown == cid
        assert escaped(cid) > 512 or shown == cid
    long_ok = "g" * 600
    items = [chat(cid, stream=True) for cid, _ in cases]
    items += [chat(long_ok + "1", text="x1"), chat(long_ok + "2", text="x2")]  # alike when cut, yet distinct
    resp = post_batch_from(server, jsonl(*items))
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    _check_rejections(batch["rejected_records"], [
        (n, shown, "streaming_unsupported", STREAMING) for n, (_cid, shown) in enumerate(cases, 1)
    ])
    assert lines_of(server, batch["rejected_records_file_id"]) == batch["rejected_records"]
    done = server.wait(batch["id"])
    assert done["request_counts"] == {"total": len(items), "completed": 2, "failed": len(cases)}
    assert sorted(r["custom_id"] for r in lines_of(server, done["output_file_id"])) == [
        long_ok + "1", long_ok + "2"]
    errors = {int(r["error"]["message"].split(":")[0].removeprefix("line ")): r
              for r in lines_of(server, done["error_file_id"])}
    assert sorted(errors) == list(range(1, len(cases) + 1))
    for n, (_cid, shown) in enumerate(cases, 1):
        assert errors[n]["custom_id"] == shown
        assert errors[n]["id"] == f"batch_req_{shown}"
        assert errors[n]["error"] == {"code": "streaming_unsupported", "message": f"line {n}: {STREAMING}"}


def test_create_answer_follows_the_example(server, engine):
    """The create answer of docs/api-contract.md §13: 4 records, req-1 twice and req-2 streaming, field by field."""
    content = jsonl(chat("req-1"), chat("req-2", stream=True), chat("req-3"), chat("req-1"))
    file_id = upload(server, content)
    before = int(time.time())
    resp = post_batch(server, input_file_id=file_id, endpoint=CHAT, completion_window="24h",
                  metadata={"job": "nightly-summaries"})
    after = int(time.time())
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    assert set(batch) == BATCH_FIELDS | CREATE_ONLY
    assert BATCH_ID.match(batch["id"])
    assert batch["object"] == "batch"
    assert batch["endpoint"] == CHAT
    assert batch["input_file_id"] == file_id
    assert batch["completion_window"] == "24h"
    assert batch["priority"] == "standard"
    assert batch["status"] == "validating"
    assert batch["model"] == "test/echo"
    assert before <= batch["created_at"] <= after
    assert batch["in_progress_at"] is None
    assert batch["expires_at"] == batch["created_at"] + 86_400
    for field in ("finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at",
                  "output_file_id", "error_file_id", "errors"):
        assert batch[field] is None, field
    assert batch["request_counts"] == {"total": 4, "completed": 0, "failed": 3}
    assert batch["usage"] == batch_usage()  # every field, zeros
    assert batch["metadata"] == {"job": "nightly-summaries"}
    assert batch["rejected_count"] == 3
    assert batch["rejected_records"] == [
        {"line": 1, "custom_id": "req-1", "code": "duplicate_custom_id", "message": DUPLICATE},
        {"line": 2, "custom_id": "req-2", "code": "streaming_unsupported", "message": STREAMING},
        {"line": 4, "custom_id": "req-1", "code": "duplicate_custom_id", "message": DUPLICATE},
    ]
    assert FILE_ID.match(batch["rejected_records_file_id"])
    assert batch["rejected_records_file_id"] != file_id
    assert lines_of(server, batch["rejected_records_file_id"]) == batch["rejected_records"]

    # The three create-only fields are on the create answer alone.
    got = server.http("GET", f"/batches/{batch['id']}").json()
    assert set(got) == BATCH_FIELDS
    assert got["request_counts"]["total"] == 4 and got["model"] == "test/echo"
    assert batch_ids(server) == [batch["id"]]

    done = server.wait(batch["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    # §13's error lines: the rejection's code, "line N: " before its message, no status_code.
    errors = sorted(lines_of(server, done["error_file_id"]), key=lambda r: r["error"]["message"])
    assert errors == [
        {"id": "batch_req_req-1", "custom_id": "req-1", "response": None,
         "error": {"code": "duplicate_custom_id", "message": f"line 1: {DUPLICATE}"}},
        {"id": "batch_req_req-2", "custom_id": "req-2", "response": None,
         "error": {"code": "streaming_unsupported", "message": f"line 2: {STREAMING}"}},
        {"id": "batch_req_req-1", "custom_id": "req-1", "response": None,
         "error": {"code": "duplicate_custom_id", "message": f"line 4: {DUPLICATE}"}},
    ]
    assert [r["custom_id"] for r in lines_of(server, done["output_file_id"])] == ["req-3"]


def test_a_create_without_rejections_has_only_the_count(server):
    resp = post_batch(server, requests=[chat("req-1"), chat("req-2")])
    assert resp.status_code == 200, resp.text
    batch = resp.json()
    assert set(batch) == BATCH_FIELDS | {"rejected_count"}
    assert batch["rejected_count"] == 0
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    assert FILE_ID.match(batch["input_file_id"])  # inline requests are stored as a file and named here
    assert batch["model"] == "test/echo"


def test_no_valid_records_creates_nothing(server):
    """§13's 400: every record rejected, the same fields under error, no batch."""
    content = jsonl(chat("req-1", model="openrelay/unknown"), b'{"custom_id": "req-2", "method": no}')
    input_id = upload(server, content)
    resp = post_batch(server, input_file_id=input_id)
    error = error_of(resp, 400, "no_valid_records")
    assert set(error) == {"message", "type", "code", "param", "rejected_records", "rejected_records_file_id",
                          "rejected_count", "request_counts"}
    assert error["message"] == "all 2 records were rejected; see rejected_records"
    assert error["rejected_records"] == [
        {"line": 1, "custom_id": "req-1", "code": "model_not_offered",
         "message": f'model "openrelay/unknown" is not offered for batch ({OFFERED})'},
        {"line": 2, "custom_id": "", "code": "invalid_json", "message": EXAMPLE_JSON_ERROR},
    ]
    assert FILE_ID.match(error["rejected_records_file_id"]) and error["rejected_records_file_id"] != input_id
    assert error["rejected_count"] == 2
    assert error["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    assert lines_of(server, error["rejected_records_file_id"]) == error["rejected_records"]

    # Inline, with blank-free positions; three records, all rejected.
    resp = post_batch(server, requests=[chat("a", stream=True), chat("a"), "not a record"])
    error = error_of(resp, 400, "no_valid_records")
    assert error["message"] == "all 3 records were rejected; see rejected_records"
    assert [(r["line"], r["custom_id"], r["code"]) for r in error["rejected_records"]] == [
        (1, "a", "duplicate_custom_id"), (2, "a", "duplicate_custom_id"), (3, "", "invalid_json")]
    assert error["rejected_count"] == 3
    assert error["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert lines_of(server, error["rejected_records_file_id"]) == error["rejected_records"]
    assert batch_ids(server) == []
