"""A newcomer's first hour, the server's side (issue 22): the SDK's ``models.retrieve``, 404s that say what was
meant, a JSON file that is not JSONL told so, a malformed upload's 400, and ``orl serve``'s access log."""

from __future__ import annotations

import re
import signal

import openai
import orjson
import pytest

from tests.support import http_client

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

RECORD = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
          "body": {"model": "test/echo", "messages": [{"role": "user", "content": "hi"}]}}


def test_the_sdk_retrieves_a_model_by_its_id_slash_included(server):
    client = server.client()
    model = client.models.retrieve("test/echo")
    assert (model.id, model.object, model.owned_by) == ("test/echo", "model", "openrelay")
    assert "/v1/chat/completions" in model.model_dump()["endpoints"]
    assert model.model_dump() == next(m.model_dump() for m in client.models.list() if m.id == "test/echo")
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("test/nope")
    error = refused.value.body
    assert error["code"] == "model_not_found" and error["message"] == "The model 'test/nope' does not exist"


def test_a_synchronous_route_says_this_is_a_batch_service(server):
    for path in ("/chat/completions", "/embeddings", "/responses"):
        answer = server.http("POST", path, json=RECORD["body"])
        assert answer.status_code == 404
        message = answer.json()["error"]["message"]
        assert message.startswith(f"Unknown request URL: POST /v1{path}.")
        assert "batch service" in message and "POST /v1/files" in message and "POST /v1/batches" in message


def test_a_method_a_route_does_not_take_is_a_405_with_allow(server):
    """Issue 34 part 6: code ``method_not_allowed`` and ``Allow`` naming every method the path takes."""
    for method, path, allow in (("DELETE", "/batches", "GET, POST"), ("PUT", "/files", "GET, POST"),
                                ("POST", "/batches/batch_000000000000", "GET"),
                                ("GET", "/batches/batch_000000000000/cancel", "POST"),
                                ("PATCH", "/webhooks/we_0", "DELETE")):
        answer = server.http(method, path)
        assert answer.status_code == 405, (method, path, answer.text)
        assert answer.headers["allow"] == allow, (method, path)
        error = answer.json()["error"]
        assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"
        assert error["message"] == f"{method} is not allowed on /v1{path}; it takes {allow}"


def test_a_base_url_without_v1_is_told_so(server):
    root = server.base_url.removesuffix("/v1")
    client = openai.OpenAI(base_url=root, api_key=server.api_key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("test/echo")
    assert refused.value.body["message"] == (
        "Unknown request URL: GET /models/test/echo. The API is under /v1: did you mean GET /v1/models/test/echo?"
        " (A client's base URL ends in /v1.)")
    answer = http_client.get(f"{root}/nothing/here")
    assert answer.json()["error"]["message"] == "Unknown request URL: GET /nothing/here."


@pytest.mark.parametrize(("text", "looks_like"), [
    (orjson.dumps([RECORD, {**RECORD, "custom_id": "b"}]), "a JSON array"),
    (orjson.dumps(RECORD, option=orjson.OPT_INDENT_2), "pretty-printed JSON"),
])
def test_a_json_file_that_is_not_jsonl_is_told_what_jsonl_is(server, tmp_path, text, looks_like):
    client = server.client()
    path = tmp_path / "requests.json"
    path.write_bytes(b"\xef\xbb\xbf" + text + b"\n")
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    error = refused.value.body
    assert error["code"] == "no_valid_records"
    assert error["message"].endswith(f"; see rejected_records. The input must be JSONL, one request object per "
                                     f"line; it looks like {looks_like}: " + (
                                         "write each element on a line of its own" if "array" in looks_like
                                         else "write each request on a single line"))
    assert error["rejected_count"] >= 1  # the lines are still rejected one by one, as before


def test_a_jsonl_file_whose_records_are_all_wrong_gets_no_jsonl_hint(server, tmp_path):
    client = server.client()
    path = tmp_path / "requests.jsonl"
    path.write_bytes(orjson.dumps({**RECORD, "url": "/v1/embeddings"}) + b"\n")
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert refused.value.body["message"] == "all 1 records were rejected; see rejected_records"


def test_a_multipart_part_header_of_a_megabyte_is_a_400(server):
    boundary = "b0undary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{"a" * 1_000_000}.jsonl"\r\n'
            f'Content-Type: application/jsonl\r\n\r\n{orjson.dumps(RECORD).decode()}\n\r\n--{boundary}--\r\n')
    answer = server.http("POST", "/files", content=body.encode(),
                         headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert answer.status_code == 400, answer.text
    # python-multipart (pinned) holds a part's header line to 4224 bytes: a 400 like every malformed form.
    assert answer.json()["error"]["message"] == "malformed multipart body: Maximum header size exceeded"
    assert server.http("GET", "/files").json()["data"] == []  # nothing was kept
    assert "unexpected error" not in server.log()


def test_serve_logs_each_request_without_its_key_and_says_when_it_stopped(make_server):
    served = make_server()
    org_id = next(org.id for org in served.store_accounts().list_orgs() if org.name == "default")
    served.http("GET", "/models?after=secret-looking-query")
    served.http("GET", "/batches/batch_nope")
    served.http("GET", "/models", api_key="sk-wrong")
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn ends by raising the signal it caught again
    log = served.log()
    assert served.api_key not in log and "sk-wrong" not in log and "secret-looking-query" not in log
    lines = [line for line in log.splitlines() if "openrelay.access" in line]
    def logged(method_path_status: str, org: str) -> bool:
        pattern = re.compile(rf" openrelay\.access: {re.escape(method_path_status)} \d+\.\dms org={re.escape(org)}"
                             r" request_id=req_[0-9a-f]{32}$")
        return any(pattern.search(line) for line in lines)

    assert logged("GET /v1/models 200", org_id), lines
    assert logged("GET /v1/batches/batch_nope 404", org_id), lines
    assert logged("GET /v1/models 401", "-"), lines
    assert log.rstrip().endswith("openrelay: stopped (the worker handed its batches back)")


def test_no_access_log_turns_it_off(make_server):
    served = make_server(args=["--no-access-log"])
    assert served.http("GET", "/models").status_code == 200
    served.stop()
    assert "openrelay.access" not in served.log()
