"""Request ids (docs/api-contract.md §1): every answer's ``x-request-id`` (what the official ``openai`` SDK reads
as ``request_id``) and ``request-id`` (the ``anthropic`` SDK's header), the same id in the access log and in a 5xx's
message; each result line's ``request_id``, the ``x-request-id`` its engine call carried."""

from __future__ import annotations

import re

import openai
import pytest

from tests.support import http_client
from tests.support.batches import chat, create, error_of, jsonl, results
from tests.support.polling import wait_for
from tests.support.server import Server
from tests.support.test_engine import EngineControl as Engine

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")
RECORD_REQUEST_ID = re.compile(r"[0-9a-f]{32}")  # OpenAI output lines' shape, a UUID to engines that want one


def _id_of(headers: dict[str, str] | object) -> str:
    request_id = headers["x-request-id"]  # type: ignore[index]
    assert REQUEST_ID.fullmatch(request_id), request_id
    assert headers["request-id"] == request_id  # type: ignore[index]
    return request_id


def _logged(server: Server, request_id: str) -> str:
    """The access log's line of the request ``request_id`` (written once its answer went out)."""
    return wait_for(lambda: next((line for line in server.log().splitlines()
                                  if line.endswith(f" request_id={request_id}")), None), f"{request_id} logged")


def test_every_answer_carries_a_request_id_that_the_sdk_reads_and_the_access_log_names(server: Server) -> None:
    client = server.client()
    raw = client.files.with_raw_response.create(file=("in.jsonl", jsonl(chat("a"))), purpose="batch")
    uploaded = raw.parse()
    assert uploaded._request_id == raw.request_id == _id_of(raw.headers)
    retrieved = client.files.retrieve(uploaded.id)
    assert REQUEST_ID.fullmatch(retrieved._request_id or "") and retrieved._request_id != uploaded._request_id

    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.retrieve("batch_000000000000")
    request_id = missing.value.request_id
    assert request_id is not None and request_id == _id_of(missing.value.response.headers)
    assert " openrelay.access: GET /v1/batches/batch_000000000000 404 " in _logged(server, request_id)
    assert REQUEST_ID.fullmatch(_logged(server, raw.request_id).rsplit("=", 1)[1])

    # Answers the routes never see: a refusal before the app (a head over the limit), an unknown URL, the dashboard.
    refused = server.http("GET", "/files", headers={"x-padding": "a" * 70_000})
    assert refused.status_code == 431
    wait_for(lambda: f"(request_id={_id_of(refused.headers)})" in server.log(), "the refusal logged")
    _id_of(server.http("GET", "/no-such-route").headers)
    _id_of(http_client.get(f"http://127.0.0.1:{server.port}/login").headers)


def test_a_5xx_names_its_request_id_in_the_message_as_openai_does_and_the_log_has_the_cause(server: Server) -> None:
    uploaded = server.client().files.create(file=("in.jsonl", jsonl(chat("a"))), purpose="batch")
    (server.data_dir / "blobs" / "files" / uploaded.id).unlink()  # its bytes lost behind the store's back
    answer = server.http("GET", f"/files/{uploaded.id}/content")
    request_id = _id_of(answer.headers)
    error = error_of(answer, 500, "blob_missing", type_="server_error")
    assert error["message"] == ("the service's store did not answer; try again later "
                                f"(request ID {request_id}: please include it when you report this)")
    cause = wait_for(lambda: next((line for line in server.log().splitlines()
                                   if f"(request_id={request_id})" in line), None), "the cause logged")
    assert f"GET /v1/files/{uploaded.id}/content answered 500: " in cause
    # A 4xx's message is the client's own doing: it stays as it was.
    assert "request ID" not in error_of(server.http("GET", "/files/file-nope"), 404, "not_found", "file_id")["message"]


def test_each_result_line_carries_the_request_id_its_engine_call_sent(server: Server, engine: Engine) -> None:
    batch = create(server, [chat("fine", "ids fine"), chat("refused", "ids refused #status=400"),
                            chat("again", "ids again")])
    output, errors = results(server, server.wait(batch["id"]))
    sent = {request["body"]["messages"][0]["content"]: request["headers"].get("x-request-id")
            for request in engine.requests() if request["body"]["messages"][0]["content"].startswith("ids ")}
    assert output["fine"]["response"]["request_id"] == sent["ids fine"]
    assert output["again"]["response"]["request_id"] == sent["ids again"]
    assert errors["refused"]["error"]["request_id"] == sent["ids refused #status=400"]
    assert errors["refused"]["error"]["status_code"] == 400
    assert len(set(sent.values())) == 3 and all(RECORD_REQUEST_ID.fullmatch(rid or "") for rid in sent.values())
    assert list(output["fine"]["response"]) == ["status_code", "request_id", "body"]  # OpenAI's output lines
    assert not any("traceparent" in request["headers"] for request in engine.requests())  # tracing is off
