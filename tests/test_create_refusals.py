"""Whole-create refusals (docs/api-contract.md §3, in its order): each creates nothing.

Per-record rejections are in test_create_rules.py.
"""

from __future__ import annotations

import secrets
from typing import Any

from tests.support.batches import (
    BLANK,
    CHAT,
    ENVELOPE_KEYS,
    batch_ids,
    chat,
    error_of,
    file_ids,
    jsonl,
    line,
    org_key,
    post_batch,
    revoke,
    upload,
)

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

FEATURE_DISABLED = 'priority "expedited" is not enabled for this organization'
UNKNOWN_FILE = "file-000000000000000000000000"
_DROP = object()  # leave the field out of the body

def _workflow(custom_id: str = "wf", where: str = "body", **body: Any) -> dict[str, Any]:
    record = chat(custom_id, **body)
    if where == "body":
        record["body"]["openrelay"] = {"workflow": {"steps": [{"prompt": "next"}]}}
    else:
        record["openrelay"] = {"workflow": {"steps": []}}
    return record


def _inline(**fields: Any) -> dict[str, Any]:
    return {"endpoint": CHAT, "completion_window": "24h", "requests": [chat("req-1")], **fields}


def test_401_before_anything_and_nothing_created(server):
    body = _inline()
    error_of(server.http("POST", "/batches", api_key="", json=body), 401, "invalid_api_key")
    error_of(server.http("POST", "/batches", api_key="", json={**body, "endpoint": "/v1/nope"}), 401,
             "invalid_api_key")
    error_of(server.http("POST", "/batches", api_key="", content=b"{not json"), 401, "invalid_api_key")
    error_of(server.http("POST", "/batches", api_key="orl-not-a-real-key", json=body), 401, "invalid_api_key")
    error_of(server.http("POST", "/batches", headers={"authorization": server.api_key}, api_key="", json=body),
             401, "invalid_api_key")  # no Bearer scheme

    doomed = org_key(server, server.org)
    assert server.http("GET", "/batches", api_key=doomed).status_code == 200
    revoke(server, server.org, doomed)
    error_of(post_batch(server, api_key=doomed, requests=[chat("req-1")]), 401, "invalid_api_key")
    error_of(post_batch(server, api_key=doomed, requests=[chat("req-1")], priority="expedited", endpoint="/x"), 401,
             "invalid_api_key")
    assert batch_ids(server) == []


def test_403_missing_scopes(server):
    full = server.api_key
    no_write = org_key(server, server.org, "--scopes", "batch.read,files.read,files.write")
    no_files_read = org_key(server, server.org, "--scopes", "batch.read,batch.write,files.write")
    file_id = upload(server, jsonl(chat("req-1")), api_key=full)

    def refused(resp):
        error_of(resp, 403, "insufficient_scope", type_="permission_error")

    refused(post_batch(server, api_key=no_write, requests=[chat("req-1")]))
    refused(post_batch(server, api_key=no_write, input_file_id=file_id))
    # The scope is checked before the request's own fields, and before the body is even read as JSON.
    refused(post_batch(server, api_key=no_write, requests=[chat("req-1")], endpoint="/v1/nope", completion_window="1h"))
    refused(server.http("POST", "/batches", api_key=no_write, content=b"{not json"))
    # files.read is needed only to read an input file.
    refused(post_batch(server, api_key=no_files_read, input_file_id=file_id))
    refused(post_batch(server, api_key=no_files_read, input_file_id=UNKNOWN_FILE))
    refused(post_batch(server, api_key=no_files_read, input_file_id=file_id, endpoint="/v1/nope"))
    assert batch_ids(server, api_key=full) == []
    resp = post_batch(server, api_key=no_files_read, requests=[chat("req-1")])
    assert resp.status_code == 200, resp.text
    assert batch_ids(server, api_key=full) == [resp.json()["id"]]


def test_402_used_up_budget(server):
    broke = org_key(server, server.org, "--budget-usd", "0")
    other = server.api_key
    file_id = upload(server, jsonl(chat("req-1")), api_key=other)

    def refused(resp):
        error_of(resp, 402, "key_budget_exceeded", type_="insufficient_quota")

    refused(post_batch(server, api_key=broke, requests=[chat("req-1")]))
    refused(post_batch(server, api_key=broke, input_file_id=file_id))
    # Before the feature switch, the request's fields and the input.
    assert server.admin("org", "set", server.org, "--expedited", "off").returncode == 0
    refused(post_batch(server, api_key=broke, requests=[chat("req-1")], priority="expedited"))
    refused(post_batch(server, api_key=broke, input_file_id=UNKNOWN_FILE, endpoint="/v1/nope", completion_window="1h"))
    refused(post_batch(server, api_key=broke, requests=[_workflow()]))
    # ... but after the scopes.
    broke_reader = org_key(server, server.org, "--scopes", "batch.read", "--budget-usd", "0")
    error_of(post_batch(server, api_key=broke_reader, requests=[chat("req-1")]), 403, "insufficient_scope",
             type_="permission_error")
    assert batch_ids(server, api_key=other) == []
    # Only "used up" is checked: a key with budget left creates.
    rich = org_key(server, server.org, "--budget-usd", "0.000001")
    resp = post_batch(server, api_key=rich, requests=[chat("req-1")])
    assert resp.status_code == 200, resp.text
    assert batch_ids(server, api_key=other) == [resp.json()["id"]]


def test_409_feature_disabled_before_the_rest_of_the_request(server):
    no_expedited = f"no-expedited-{secrets.token_hex(3)}"
    key = server.new_org_key(no_expedited)
    assert server.admin("org", "set", no_expedited, "--expedited", "off").returncode == 0
    file_id = upload(server, jsonl(chat("req-1")), api_key=key)
    workflow_file = upload(server, jsonl(_workflow()), api_key=key)
    junk_file = upload(server, jsonl(chat("req-1", stream=True), b"{oops"), api_key=key)
    files = file_ids(server, api_key=key)

    def refused(**fields):
        resp = post_batch(server, api_key=key, priority="expedited", **fields)
        error = error_of(resp, 409, "feature_disabled")
        assert error["message"] == FEATURE_DISABLED
        assert set(error) == ENVELOPE_KEYS

    refused(input_file_id=file_id)
    refused(requests=[chat("req-1")])
    refused(input_file_id=file_id, endpoint="/v1/moderations", completion_window="48h")
    refused(input_file_id=UNKNOWN_FILE)
    refused(input_file_id=file_id, requests=[chat("req-1")])
    refused(endpoint=None, completion_window=None)  # neither input, no endpoint, no window
    refused(requests=[chat("req-1")], metadata={"k" * 65: "v"})
    refused(input_file_id=workflow_file)  # the input is not read
    refused(input_file_id=junk_file)
    refused(requests=[chat("a", stream=True)])
    assert batch_ids(server, api_key=key) == []
    assert file_ids(server, api_key=key) == files

    # Standard priority still works for this organization.
    resp = post_batch(server, api_key=key, requests=[chat("req-1")], priority="standard")
    assert resp.status_code == 200, resp.text
    assert resp.json()["priority"] == "standard"
    # Another organization has expedited, as does this one once turned back on.
    resp = post_batch(server, requests=[chat("req-1")], priority="expedited")
    assert resp.status_code == 200, resp.text
    assert resp.json()["priority"] == "expedited"
    assert server.admin("org", "set", no_expedited, "--expedited", "on").returncode == 0
    resp = post_batch(server, api_key=key, input_file_id=file_id, priority="expedited")
    assert resp.status_code == 200, resp.text
    assert resp.json()["priority"] == "expedited"
    assert len(batch_ids(server, api_key=key)) == 2


def test_400_bad_fields_and_404_files(server):
    file_id = upload(server, jsonl(chat("req-1")))
    other_key = server.new_org_key()
    other_file = upload(server, jsonl(chat("req-1")), api_key=other_key)
    files = file_ids(server)

    def refused(param, **fields):
        body = _inline(**fields)
        body = {k: v for k, v in body.items() if v is not _DROP}
        return error_of(server.http("POST", "/batches", json=body), 400, "invalid_request_error", param=param)

    for endpoint in ("/v1/moderations", "/v1/chat/completions/", "v1/embeddings", "", None, 5, _DROP):
        refused("endpoint", endpoint=endpoint)
    for window in ("48h", "1h", "24H", 24, None, _DROP):
        refused("completion_window", completion_window=window)
    for priority in ("urgent", "Expedited", "", 1, ["standard"]):
        refused("priority", priority=priority)
    metadata_cases = [
        {f"k{i}": "v" for i in range(33)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": 1},
        {"k": None},
        {"k": {"nested": "v"}},
        {"k": ["v"]},
        "k=v",
        ["k", "v"],
    ]
    for metadata in metadata_cases:
        refused("metadata", metadata=metadata)
    # Both or neither input.
    for body in ({**_inline(), "input_file_id": file_id}, {"endpoint": CHAT, "completion_window": "24h"}):
        resp = server.http("POST", "/batches", json=body)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "invalid_request_error" and error["param"] in ("input_file_id", "requests")
    refused("requests", requests=[])
    refused("requests", requests={"custom_id": "req-1"})
    refused("input_file_id", requests=_DROP, input_file_id=42)
    # A field error comes before the file is looked up, let alone read.
    refused("endpoint", requests=_DROP, input_file_id=UNKNOWN_FILE, endpoint="/v1/nope")
    refused("metadata", requests=_DROP, input_file_id=UNKNOWN_FILE, metadata={"k": 1})
    # The body itself.
    for raw in (b"{not json", b"[]", b'"text"', b""):
        error_of(server.http("POST", "/batches", content=raw, headers={"content-type": "application/json"}), 400,
                 "invalid_request_error")

    # Unknown, and another organization's, file ids: the same 404.
    unknown = post_batch(server, input_file_id=UNKNOWN_FILE)
    foreign = post_batch(server, input_file_id=other_file)
    assert unknown.status_code == foreign.status_code == 404, (unknown.text, foreign.text)
    assert unknown.json()["error"]["code"] == "not_found"
    assert foreign.text.replace(other_file, "ID") == unknown.text.replace(UNKNOWN_FILE, "ID")
    assert batch_ids(server) == [] and batch_ids(server, api_key=other_key) == []
    assert file_ids(server) == files

    # The boundaries themselves pass: 32 keys, a 64-character key, a 512-character value.
    metadata = {f"k{i}": "v" for i in range(30)} | {"k" * 64: "v", "long": "v" * 512}
    resp = post_batch(server, input_file_id=file_id, metadata=metadata)
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"] == metadata
    # A file that is not a batch input (here a rejections file) is a 400 on input_file_id.
    resp = post_batch(server, requests=[chat("a"), chat("b", stream=True)])
    assert resp.status_code == 200, resp.text
    error_of(post_batch(server, input_file_id=resp.json()["rejected_records_file_id"]), 400, "invalid_request_error",
             param="input_file_id")
    assert len(batch_ids(server)) == 2


def test_workflow_refuses_the_whole_create(make_server):
    server = make_server(env={"OPENRELAY_MAX_RECORDS": "5", "OPENRELAY_MAX_LINE_BYTES": "2000"})
    long_line = line(chat("long", text="x" * 2100))
    assert len(long_line) > 2000
    files = file_ids(server)
    uploads: set[str] = set()

    def refused(content: bytes | None = None, requests: list[Any] | None = None, code: str = "workflow_unsupported"):
        if content is not None:
            file_id = upload(server, content)
            uploads.add(file_id)
            resp = post_batch(server, input_file_id=file_id)
        else:
            resp = post_batch(server, requests=requests)
        error = error_of(resp, 400, code)
        assert set(error) == ENVELOPE_KEYS  # no rejected_records: nothing was judged record by record
        return error

    # In body.openrelay or a top-level openrelay, first, middle or last.
    refused(jsonl(_workflow()))
    refused(jsonl(_workflow(where="top")))
    refused(jsonl(chat("a"), BLANK, _workflow(), chat("b")))
    refused(jsonl(chat("a"), chat("b"), _workflow(where="top")))
    # Whatever the other records hold, the workflow record's own faults included.
    refused(jsonl(chat("a", stream=True), b"{oops", chat("a"), chat(""), _workflow()))
    refused(jsonl(chat("a"), {**_workflow("a"), "method": "GET"}))
    refused(jsonl({**_workflow(where="top"), "body": "not an object"}))
    refused(jsonl(_workflow(stream=True, model="openrelay/unknown")))
    refused(jsonl(chat("a", model="test/embed"), {**_workflow(where="top"), "tool_config": {}}))
    wf_and_more = _workflow()
    wf_and_more["body"]["openrelay"].update({"tool_config": {"servers": []}, "cache": True})
    refused(jsonl(wf_and_more))
    # Past the record cap (5 here): the 7th record carries it.
    past_cap = [chat(f"r{i}") for i in range(1, 7)]
    refused(jsonl(*past_cap[:3], BLANK, *past_cap[3:], _workflow(), chat("r8")))
    refused(jsonl(*past_cap, {**_workflow(where="top"), "method": "GET"}))
    escaped = line(_workflow()).replace(b'"workflow"', b'"work\\u0066low"')
    assert b"workflow" not in escaped
    refused(jsonl(escaped))
    refused(jsonl(*past_cap, escaped))
    # Before a line too long to read, past the cap or not.
    refused(jsonl(chat("a"), _workflow(), long_line, chat("b")))
    refused(jsonl(_workflow(), *[chat(f"r{i}") for i in range(1, 4)], BLANK, long_line))
    refused(jsonl(*past_cap, _workflow(), long_line))
    refused(jsonl(_workflow()) + long_line)  # the over-long last line has no newline
    # Inline, by position too.
    refused(requests=[chat("a"), _workflow()])
    refused(requests=[_workflow(where="top"), "not a record"])
    refused(requests=[*past_cap, _workflow()])
    # A line too long before the workflow record: the input cannot be read to it.
    refused(jsonl(chat("a"), long_line, _workflow()), code="input_unreadable")

    assert batch_ids(server) == []
    assert file_ids(server) == files | uploads


def test_input_too_large_and_unreadable(make_server):
    server = make_server(env={"OPENRELAY_MAX_RECORDS": "5", "OPENRELAY_MAX_LINE_BYTES": "2000"})

    def refused(content: bytes | None = None, requests: list[Any] | None = None, *, code: str):
        if content is not None:
            resp = post_batch(server, input_file_id=upload(server, content))
        else:
            resp = post_batch(server, requests=requests)
        error = error_of(resp, 400, code)
        assert set(error) == ENVELOPE_KEYS

    six = [chat(f"r{i}") for i in range(1, 7)]
    refused(jsonl(*six), code="input_too_large")
    refused(requests=six, code="input_too_large")
    refused(jsonl(*[chat("same", stream=True)] * 6), code="input_too_large")  # not no_valid_records
    refused(jsonl(*six[:5], b"{oops"), code="input_too_large")  # an unreadable record still counts
    # The word alone is no workflow record.
    refused(jsonl(*six, chat("r7", text="run my workflow"), chat("r8", openrelay={"workflows": 1})),
            code="input_too_large")

    padded = chat("padded", text="")
    padded["body"]["messages"][0]["content"] = "p" * (2000 - len(line(padded)))
    assert len(line(padded)) == 2000
    too_long = chat("too-long", text="")
    too_long["body"]["messages"][0]["content"] = "p" * (2001 - len(line(too_long)))
    assert len(line(too_long)) == 2001
    refused(jsonl(chat("a"), too_long, chat("b")), code="input_unreadable")
    refused(jsonl(too_long), code="input_unreadable")
    refused(jsonl(chat("a")) + line(too_long), code="input_unreadable")  # last line, no newline
    assert batch_ids(server) == []

    # Five records with blank lines between, one of exactly 2000 bytes: accepted.
    resp = post_batch(server, input_file_id=upload(server, jsonl(BLANK, *six[:2], BLANK, BLANK, padded, *six[2:4])))
    assert resp.status_code == 200, resp.text
    assert resp.json()["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    resp = post_batch(server, requests=six[:5])
    assert resp.status_code == 200, resp.text
    assert len(batch_ids(server)) == 2
