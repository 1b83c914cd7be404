"""The create's checks, one case a test (CONTRACT sections 3-5): the order of the refusals, each field's 400, each
record rule's rejection code, the whole-create refusals of the input, dry runs and idempotency keys. The API in
process on a real store (tests/support/relay.py); the exhaustive matrices over a live server are in
tests/test_create_rules.py and tests/test_create_refusals.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openrelay.types import Scope
from tests.support.batches import (
    CHAT,
    EMBEDDINGS,
    batch_ids,
    chat,
    embed,
    error_of,
    file_ids,
    jsonl,
    post_batch,
    upload,
    without,
)
from tests.support.relay import Relay

OFFERED = "offered: test/echo, test/embed"


def rejections_of(relay: Relay, content: bytes, endpoint: str = CHAT) -> list[dict[str, Any]]:
    """The create's ``rejected_records`` for an input file of ``content`` (a 200: some record is valid)."""
    answer = post_batch(relay, input_file_id=upload(relay, content), endpoint=endpoint)
    assert answer.status_code == 200, answer.text
    return answer.json().get("rejected_records", [])


# (record or raw line, the custom_id the rejection shows, its code)
RECORD_RULES = {
    "not-json": (b"{not json", "", "invalid_json"),
    "json-array": (b'["custom_id", "x"]', "", "invalid_json"),
    "json-string": (b'"a line"', "", "invalid_json"),
    "float-out-of-range": (b'{"custom_id": "big", "method": "POST", "url": "/v1/chat/completions", "body": '
                           b'{"model": "test/echo", "temperature": 1e400}}', "", "invalid_json"),
    "no-custom-id": (without(chat("x"), "custom_id"), "", "missing_custom_id"),
    "empty-custom-id": (chat(""), "", "missing_custom_id"),
    "number-custom-id": (chat(7), "", "missing_custom_id"),
    "get": ({**chat("get"), "method": "GET"}, "get", "invalid_method"),
    "no-method": (without(chat("no-method"), "method"), "no-method", "invalid_method"),
    "other-url": ({**chat("url"), "url": EMBEDDINGS}, "url", "url_mismatch"),
    "no-body": (without(chat("no-body"), "body"), "no-body", "invalid_body"),
    "list-body": ({**chat("list-body"), "body": []}, "list-body", "invalid_body"),
    "stream": (chat("stream", stream=True), "stream", "streaming_unsupported"),
    "bare-tool-config": (chat("moved", tool_config={"servers": [{"url": "http://127.0.0.1:9/mcp"}]}), "moved",
                         "tool_config_moved"),
    "extension-string": (chat("ext", openrelay="x"), "ext", "unknown_extension"),
    "extension-key": (chat("ext-key", openrelay={"cache": True}), "ext-key", "unknown_extension"),
    "tool-config-shape": (chat("tc", openrelay={"tool_config": {"servers": "x"}}), "tc", "invalid_tool_config"),
    "tool-not-allowed": (chat("tc-far", openrelay={"tool_config": {"servers": [{"url": "https://evil.test/mcp"}]}}),
                         "tc-far", "invalid_tool_config"),
    "tool-rounds": (chat("tc-17", openrelay={"tool_config": {"servers": [{"url": "http://127.0.0.1:9/mcp"}],
                                                             "max_rounds": 17}}), "tc-17", "invalid_tool_config"),
    "no-model": (without(chat("no-model"), "body", "model"), "no-model", "missing_model"),
    "number-model": (chat("num-model", model=7), "num-model", "missing_model"),
    "unknown-model": (chat("unknown", model="openrelay/unknown"), "unknown", "model_not_offered"),
    "endpoint-model": (chat("embed-model", model="test/embed"), "embed-model", "model_endpoint_mismatch"),
}


@pytest.mark.parametrize("case", RECORD_RULES)
def test_a_record_breaking_a_rule_is_rejected_with_its_code_and_the_rest_accepted(relay: Relay, case: str) -> None:
    record, custom_id, code = RECORD_RULES[case]
    raw = record if isinstance(record, bytes) else None
    content = jsonl(chat("first"), raw if raw is not None else record, chat("last"))
    (rejection,) = rejections_of(relay, content)
    assert (rejection["line"], rejection["custom_id"], rejection["code"]) == (2, custom_id, code)
    assert isinstance(rejection["message"], str) and rejection["message"]


def test_a_model_not_offered_names_the_models_that_are(relay: Relay) -> None:
    (rejection,) = rejections_of(relay, jsonl(chat("ok"), chat("x", model="openrelay/unknown")))
    assert rejection["message"] == f'model "openrelay/unknown" is not offered for batch ({OFFERED})'


def test_duplicate_custom_ids_reject_every_occurrence(relay: Relay) -> None:
    found = rejections_of(relay, jsonl(chat("a"), chat("b"), chat("a"), chat("c")))
    assert [(r["line"], r["custom_id"], r["code"]) for r in found] == [(1, "a", "duplicate_custom_id"),
                                                                        (3, "a", "duplicate_custom_id")]


def test_the_batchs_model_is_its_first_valid_records_and_others_mismatch(relay: Relay) -> None:
    content = jsonl(embed("bad", model="nope/x"), embed("first", model="test/embed"), embed("other"))
    answer = post_batch(relay, input_file_id=upload(relay, content), endpoint=EMBEDDINGS)
    assert answer.status_code == 200 and answer.json()["model"] == "test/embed"
    assert [(r["line"], r["code"]) for r in answer.json()["rejected_records"]] == [
        (1, "model_not_offered"), (3, "model_mismatch")]


def test_blank_lines_count_in_line_numbers_but_are_no_records(relay: Relay) -> None:
    content = b"\n" + jsonl(chat("a")) + b"\n\n" + jsonl(chat("b", stream=True))
    answer = post_batch(relay, input_file_id=upload(relay, content))
    assert answer.status_code == 200 and answer.json()["request_counts"]["total"] == 2
    assert [(r["line"], r["custom_id"]) for r in answer.json()["rejected_records"]] == [(5, "b")]


def test_inline_requests_are_numbered_by_position(relay: Relay) -> None:
    answer = post_batch(relay, requests=[chat("a"), chat("b"), chat("c", stream=True)])
    assert answer.status_code == 200
    assert [(r["line"], r["custom_id"]) for r in answer.json()["rejected_records"]] == [(3, "c")]


def test_the_rejections_file_is_readable_as_soon_as_the_create_answers(relay: Relay) -> None:
    answer = post_batch(relay, requests=[chat("a"), chat("b", stream=True)]).json()
    content = relay.http("GET", f"/files/{answer['rejected_records_file_id']}/content")
    assert content.status_code == 200 and content.text.count("\n") == 1 and '"streaming_unsupported"' in content.text


def test_no_valid_record_creates_nothing(relay: Relay) -> None:
    answer = post_batch(relay, requests=[chat("a", model="nope/x"), chat("b", stream=True)])
    error = error_of(answer, 400, "no_valid_records")
    assert error["message"] == "all 2 records were rejected; see rejected_records"
    assert error["rejected_count"] == 2 and error["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    assert batch_ids(relay) == []


# -- the request's own fields -------------------------------------------------------------------------------------

DROP = object()
FIELD_REFUSALS = [
    ("endpoint", "/v1/moderations"), ("endpoint", "v1/embeddings"), ("endpoint", 5), ("endpoint", DROP),
    ("completion_window", "48h"), ("completion_window", 24), ("completion_window", DROP),
    ("priority", "urgent"), ("priority", "Expedited"), ("priority", 1),
    ("metadata", {f"k{i}": "v" for i in range(33)}), ("metadata", {"k" * 65: "v"}), ("metadata", {"k": "v" * 513}),
    ("metadata", {"k": 1}), ("metadata", {"k": None}), ("metadata", "k=v"),
    ("requests", []), ("requests", {"custom_id": "a"}),
    ("failure_threshold", {"error_rate": 2, "min_records": 5}), ("failure_threshold", {"error_rate": 0.5}),
    ("failure_threshold", 0.5),
]
PARAMS = {"{'error_rate': 2, 'min_records': 5}": "failure_threshold.error_rate",
          "{'error_rate': 0.5}": "failure_threshold.min_records"}


@pytest.mark.parametrize(("field", "value"), FIELD_REFUSALS, ids=lambda v: str(v)[:24] if v is not DROP else "absent")
def test_a_bad_field_is_a_400_naming_it_and_nothing_is_created(relay: Relay, field: str, value: Any) -> None:
    body: dict[str, Any] = {"endpoint": CHAT, "completion_window": "24h", "requests": [chat("a")], field: value}
    if value is DROP:
        del body[field]
    param = PARAMS.get(str(value), field)
    error_of(relay.http("POST", "/batches", json=body), 400, "invalid_request_error", param=param)
    assert batch_ids(relay) == []


def test_an_unknown_field_is_named_as_openai_names_it(relay: Relay) -> None:
    error = error_of(post_batch(relay, requests=[chat("a")], temperature=1), 400, "invalid_request_error",
                     param="temperature")
    assert error["message"] == "Unrecognized request argument supplied: temperature"


def test_metadata_at_its_limits_is_accepted(relay: Relay) -> None:
    metadata = {f"k{i}": "v" for i in range(30)} | {"k" * 64: "v", "long": "v" * 512}
    answer = post_batch(relay, requests=[chat("a")], metadata=metadata)
    assert answer.status_code == 200 and answer.json()["metadata"] == metadata


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'"text"', b""], ids=["broken", "array", "string", "empty"])
def test_a_body_that_is_no_json_object_is_a_400(relay: Relay, raw: bytes) -> None:
    answer = relay.http("POST", "/batches", content=raw, headers={"content-type": "application/json"})
    error_of(answer, 400, "invalid_request_error")


def test_both_or_neither_input_is_a_400(relay: Relay) -> None:
    file_id = upload(relay, jsonl(chat("a")))
    for body in ({"requests": [chat("a")], "input_file_id": file_id}, {}):
        answer = relay.http("POST", "/batches", json={"endpoint": CHAT, "completion_window": "24h", **body})
        assert answer.status_code == 400 and answer.json()["error"]["param"] in ("input_file_id", "requests")


def test_an_unknown_or_foreign_input_file_is_the_same_404(relay: Relay) -> None:
    _org, other = relay.new_org()
    foreign = upload(relay, jsonl(chat("a")), api_key=other)
    unknown = post_batch(relay, input_file_id="file-000000000000000000000000")
    theirs = post_batch(relay, input_file_id=foreign)
    error_of(unknown, 404, "not_found", param=unknown.json()["error"]["param"])
    assert theirs.status_code == 404
    assert theirs.text.replace(foreign, "ID") == unknown.text.replace("file-000000000000000000000000", "ID")


def test_a_deleted_input_file_cannot_be_used(relay: Relay) -> None:
    file_id = upload(relay, jsonl(chat("a")))
    assert relay.http("DELETE", f"/files/{file_id}").status_code == 200
    assert post_batch(relay, input_file_id=file_id).status_code == 404


def test_a_rejections_file_is_no_batch_input(relay: Relay) -> None:
    made = post_batch(relay, requests=[chat("a"), chat("b", stream=True)]).json()
    error_of(post_batch(relay, input_file_id=made["rejected_records_file_id"]), 400, "invalid_request_error",
             param="input_file_id")


# -- who may create -----------------------------------------------------------------------------------------------

def test_no_key_or_an_unknown_key_is_a_401_before_anything_else(relay: Relay) -> None:
    for key in ("", "orl-not-a-real-key"):
        error_of(post_batch(relay, api_key=key, endpoint="/v1/nope", requests=[]), 401, "invalid_api_key")
    assert batch_ids(relay) == []


@pytest.mark.parametrize("missing", [Scope.BATCH_WRITE, Scope.FILES_READ])
def test_a_key_without_a_scope_the_create_needs_is_a_403(relay: Relay, missing: str) -> None:
    every = (Scope.FILES_READ, Scope.FILES_WRITE, Scope.BATCH_READ, Scope.BATCH_WRITE)
    _org, key = relay.new_org(scopes=tuple(s for s in every if s != missing))
    answer = post_batch(relay, api_key=key, input_file_id=upload(relay, jsonl(chat("a")), api_key=key))
    error_of(answer, 403, "insufficient_scope", type_="permission_error")


def test_expedited_switched_off_is_a_409_before_the_input_is_read(relay: Relay) -> None:
    relay.rt.accounts.set_expedited(relay.org, False)
    answer = post_batch(relay, priority="expedited", input_file_id="file-000000000000000000000000")
    error = error_of(answer, 409, "feature_disabled")
    assert error["message"] == 'priority "expedited" is not enabled for this organization'
    assert post_batch(relay, requests=[chat("a")]).status_code == 200  # standard still goes


# -- the input as a whole -----------------------------------------------------------------------------------------

def test_more_records_than_the_limit_is_input_too_large(tmp_path: Path) -> None:
    with Relay(tmp_path, env={"OPENRELAY_MAX_RECORDS": "3"}) as relay:
        assert post_batch(relay, requests=[chat(f"r{i}") for i in range(3)]).status_code == 200
        error_of(post_batch(relay, requests=[chat(f"r{i}") for i in range(4)]), 400, "input_too_large")


def test_a_workflow_record_refuses_the_whole_create(relay: Relay) -> None:
    records = [chat("a"), chat("wf", openrelay={"workflow": {"steps": []}}), chat("b", stream=True)]
    error_of(post_batch(relay, requests=records), 400, "workflow_unsupported")
    assert batch_ids(relay) == []


# -- dry runs and idempotency -------------------------------------------------------------------------------------

def test_a_dry_run_checks_everything_and_creates_nothing(relay: Relay) -> None:
    files = file_ids(relay)
    answer = post_batch(relay, requests=[chat("a"), chat("b", stream=True)], dry_run=True)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert found["id"] is None and found["dry_run"] is True and found["rejected_count"] == 1
    assert "estimate" in found["openrelay"]
    assert batch_ids(relay) == [] and file_ids(relay) == files


def create_with_key(relay: Relay, key: str, records: list[dict[str, Any]]) -> Any:
    return relay.http("POST", "/batches", headers={"Idempotency-Key": key},
                      json={"endpoint": CHAT, "completion_window": "24h", "requests": records})


def test_the_same_key_and_body_answer_the_same_batch_once(relay: Relay) -> None:
    first = create_with_key(relay, "nightly-1", [chat("a")])
    again = create_with_key(relay, "nightly-1", [chat("a")])
    assert first.status_code == again.status_code == 200 and first.json()["id"] == again.json()["id"]
    assert batch_ids(relay) == [first.json()["id"]]


def test_the_same_key_with_another_body_is_a_422(relay: Relay) -> None:
    assert create_with_key(relay, "nightly-2", [chat("a")]).status_code == 200
    error_of(create_with_key(relay, "nightly-2", [chat("b")]), 422, "idempotency_key_reused")
    assert len(batch_ids(relay)) == 1


def test_keys_are_per_organization(relay: Relay) -> None:
    _org, other = relay.new_org()
    mine = create_with_key(relay, "shared", [chat("a")])
    theirs = relay.http("POST", "/batches", api_key=other, headers={"Idempotency-Key": "shared"},
                        json={"endpoint": CHAT, "completion_window": "24h", "requests": [chat("a")]})
    assert mine.status_code == theirs.status_code == 200 and mine.json()["id"] != theirs.json()["id"]


def test_a_refused_create_stores_no_answer_under_its_key(relay: Relay) -> None:
    assert create_with_key(relay, "fix-and-retry", [chat("a", stream=True)]).status_code == 400
    assert create_with_key(relay, "fix-and-retry", [chat("a")]).status_code == 200


@pytest.mark.parametrize("key", ["", "k" * 513])
def test_an_idempotency_key_outside_1_to_512_bytes_is_a_400(relay: Relay, key: str) -> None:
    answer = create_with_key(relay, key, [chat("a")])
    assert answer.status_code == 400 and batch_ids(relay) == []
