"""Retry failures in one command (issue 14 part 3): ``POST /v1/batches/{id}/retry`` and `orl batches retry`
make a new batch, by the normal create, of the original lines of the records that ended in error."""

from __future__ import annotations

import time

import openai
import orjson

from tests.support.batches import chat, create, get, upload, wait_for, wait_letting_held_through

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def _retry(server, batch_id: str, body: dict | None = None, api_key: str | None = None, **headers: str):
    return server.http("POST", f"/batches/{batch_id}/retry", api_key=api_key, json=body or {}, headers=headers)


def _input_lines(server, batch: dict) -> list[bytes]:
    content = server.http("GET", f"/files/{batch['input_file_id']}/content")
    assert content.status_code == 200, content.text
    return content.content.splitlines()


def _mixed_batch(server) -> tuple[dict, dict[str, bytes]]:
    """An ended batch from a file: two successes, a 400, a 500 that stays one, a rejection, a blank line. The
    lines are spelled as a person might (spaces, key order) so that byte-for-byte copying shows."""
    lines = {
        "ok-1": orjson.dumps(chat("ok-1", "fine")),
        "bad-400": b'{"custom_id": "bad-400", "method": "POST", "url": "/v1/chat/completions", '
                   b'"body": {"messages": [{"role": "user", "content": "no #status=400"}], "model": "test/echo"}}',
        "ok-2": orjson.dumps(chat("ok-2", "fine too")),
        "bad-500": orjson.dumps(chat("bad-500", "broken #status=500")) + b"  ",
        "streamed": orjson.dumps({**chat("streamed", "x"), "body": {**chat("streamed", "x")["body"], "stream": True}}),
    }
    data = b"\n".join([lines["ok-1"], lines["bad-400"], b"", lines["ok-2"], lines["bad-500"], lines["streamed"]])
    file_id = upload(server, data + b"\n")
    created = server.http("POST", "/batches", json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "metadata": {"tags": "nightly,eval", "job": "summaries"}})
    assert created.status_code == 200 and created.json()["rejected_count"] == 1, created.text
    batch = server.wait(created.json()["id"])
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    return batch, lines


def test_retry_takes_every_run_time_failure_line_for_line_and_not_the_rejection(server, engine):
    batch, lines = _mixed_batch(server)
    answer = _retry(server, batch["id"])
    assert answer.status_code == 200, answer.text
    retried = answer.json()
    assert retried["id"] != batch["id"] and retried["status"] == "validating"
    assert retried["retried_count"] == 2 and retried["request_counts"]["total"] == 2
    assert retried["rejected_count"] == 0
    assert retried["metadata"] == {"retry_of": batch["id"], "tags": "nightly,eval"}
    assert retried["endpoint"] == batch["endpoint"] and retried["priority"] == batch["priority"]
    # The original lines, byte for byte (less the spaces after the last brace), in input order.
    assert _input_lines(server, retried) == [lines["bad-400"], lines["bad-500"].rstrip()]
    # It runs like any batch; its tags find it in the list.
    again = server.wait(retried["id"])
    assert again["status"] == "completed" and again["request_counts"]["failed"] == 2
    tagged = server.http("GET", "/batches", params={"tag": "nightly"}).json()["data"]
    assert {b["id"] for b in tagged} == {batch["id"], retried["id"]}


def test_codes_choose_which_failures(server, engine):
    batch, lines = _mixed_batch(server)
    only_5xx = _retry(server, batch["id"], {"codes": ["server_error"]})
    assert only_5xx.status_code == 200, only_5xx.text
    assert only_5xx.json()["retried_count"] == 1
    assert _input_lines(server, only_5xx.json()) == [lines["bad-500"].rstrip()]
    # A rejection's code takes nothing: create rejections are never retried.
    none = _retry(server, batch["id"], {"codes": ["streaming_unsupported"]})
    assert none.status_code == 400 and none.json()["error"]["code"] == "nothing_to_retry"
    bad = _retry(server, batch["id"], {"codes": "server_error"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "codes"
    unknown = _retry(server, batch["id"], {"code": ["server_error"]})
    assert unknown.status_code == 400 and "Unrecognized request argument" in unknown.json()["error"]["message"]


def test_cancelled_batch_retries_the_records_that_never_started(server, engine):
    gate = "retry-cancel"
    created = create(server, [chat(f"c{i}", f"slow {i} #hold={gate}") for i in range(12)])
    engine.wait_held(gate, 2)
    engine.release(gate, count=2)
    server.http("POST", f"/batches/{created['id']}/cancel")
    batch = wait_letting_held_through(server, engine, gate, created["id"])
    assert batch["status"] == "cancelled"
    errors = [orjson.loads(x) for x in server.http("GET", f"/files/{batch['error_file_id']}/content")
              .content.splitlines()]
    unrun = sorted(line["custom_id"] for line in errors if line["error"]["code"] == "batch_cancelled")
    assert unrun and batch["request_counts"]["completed"] >= 2
    answer = _retry(server, batch["id"], {"codes": ["batch_cancelled"]})
    assert answer.status_code == 200, answer.text
    taken = [orjson.loads(x)["custom_id"] for x in _input_lines(server, answer.json())]
    assert sorted(taken) == unrun and answer.json()["retried_count"] == len(unrun)
    # By default: every record not in the output file, which here is the same set.
    everything = _retry(server, batch["id"]).json()
    assert everything["retried_count"] == 12 - batch["request_counts"]["completed"] == len(unrun)
    engine.release(gate)


def test_retry_goes_through_the_normal_create_idempotency_included(server, engine):
    batch, _lines = _mixed_batch(server)
    first = _retry(server, batch["id"], **{"Idempotency-Key": "retry-once"})
    second = _retry(server, batch["id"], **{"Idempotency-Key": "retry-once"})
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()  # the stored answer: one batch
    ids = {b["id"] for b in server.http("GET", "/batches", params={"limit": 100}).json()["data"]}
    assert ids == {batch["id"], first.json()["id"]}
    other = _retry(server, batch["id"], {"codes": ["server_error"]}, **{"Idempotency-Key": "retry-once"})
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    # As on create, a key whose budget is used up gets 402 before anything is looked up.
    broke = server.new_org_key(None, "--budget-usd", "0")
    assert _retry(server, batch["id"], api_key=broke).status_code == 402


def test_refusals(server, engine):
    gate = "retry-refusals"
    running = create(server, [chat("r", f"wait #hold={gate}")])
    busy = _retry(server, running["id"])
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "batch_not_ended"
    engine.release(gate)
    done = server.wait(running["id"])
    nothing = _retry(server, done["id"])
    assert nothing.status_code == 400 and nothing.json()["error"]["code"] == "nothing_to_retry"
    assert _retry(server, "batch_000000000000").status_code == 404
    assert _retry(server, done["id"], api_key=server.new_org_key()).status_code == 404
    read_only = server.new_org_key(None, "--scopes", "batch.read,files.read")
    assert _retry(server, done["id"], api_key=read_only).status_code == 403
    # The input deleted after the end: the records cannot be read again.
    batch, _lines = _mixed_batch(server)
    assert server.http("DELETE", f"/files/{batch['input_file_id']}").status_code == 200
    gone = _retry(server, batch["id"])
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "input_file_deleted"


def test_sdk_retry_through_client_post(server, engine):
    batch, _lines = _mixed_batch(server)
    client = server.client()
    retried = client.post(f"/batches/{batch['id']}/retry", body={}, cast_to=openai.types.Batch)
    assert isinstance(retried, openai.types.Batch)
    assert retried.metadata == {"retry_of": batch["id"], "tags": "nightly,eval"}
    assert retried.request_counts.total == 2 and retried.model_extra["retried_count"] == 2
    assert client.batches.retrieve(retried.id).status in ("validating", "in_progress", "finalizing", "completed")


def test_cli_retry_prints_the_new_batch_and_says_how_many(server, engine):
    batch, _lines = _mixed_batch(server)
    done = server.orl("batches", "retry", batch["id"], "--codes", "invalid_request_error,server_error")
    assert done.returncode == 0, done.stderr
    retried = orjson.loads(done.stdout)
    assert retried["retried_count"] == 2 and retried["metadata"]["retry_of"] == batch["id"]
    assert f"retrying 2 records of {batch['id']} as {retried['id']}" in done.stderr
    assert get(server, retried["id"])["request_counts"]["total"] == 2
    keyed = [server.orl("batches", "retry", batch["id"], "--codes", "server_error", "--idempotency-key", "k1")
             for _ in range(2)]
    assert [k.returncode for k in keyed] == [0, 0]
    assert orjson.loads(keyed[0].stdout)["id"] == orjson.loads(keyed[1].stdout)["id"]
    nothing = server.orl("batches", "retry", batch["id"], "--codes", "no_such_code")
    assert nothing.returncode == 2 and orjson.loads(nothing.stdout)["error"]["code"] == "nothing_to_retry"
    assert server.orl("batches", "retry", "batch_000000000000").returncode == 4
    gate = "retry-cli"
    running = create(server, [chat("r", f"wait #hold={gate}")])
    assert server.orl("batches", "retry", running["id"]).returncode == 7
    engine.release(gate)


def test_the_create_rules_apply_again_expedited_turned_off_is_409(server, engine):
    created = create(server, [chat("x1", "no #status=400"), chat("x2", "fine")], priority="expedited")
    batch = server.wait(created["id"])
    assert batch["priority"] == "expedited" and batch["request_counts"]["failed"] == 1
    assert server.admin("org", "set", server.org, "--expedited", "off").returncode == 0
    refused = _retry(server, batch["id"])
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "feature_disabled"
    assert server.orl("batches", "retry", batch["id"]).returncode == 6
    assert server.admin("org", "set", server.org, "--expedited", "on").returncode == 0
    retried = _retry(server, batch["id"]).json()
    assert retried["priority"] == "expedited" and retried["retried_count"] == 1


def test_expired_batch_retries_what_the_window_left_unrun(make_server, engine):
    server = make_server(concurrency=2, args=("--window-seconds", "3"))
    gate, total = "retry-expired", 10
    created = create(server, [chat(f"e{i}", f"late {i} #hold={gate}") for i in range(total)])
    engine.wait_held(gate, 2)
    engine.release(gate, count=2)
    wait_for(lambda: get(server, created["id"])["request_counts"]["completed"] == 2, "two finished records")
    wait_for(lambda: time.time() >= created["expires_at"], "the window to close", timeout=10)
    engine.release(gate)
    batch = server.wait(created["id"])
    assert batch["status"] == "expired"
    errors = [orjson.loads(x) for x in server.http("GET", f"/files/{batch['error_file_id']}/content")
              .content.splitlines()]
    expired = sorted(line["custom_id"] for line in errors if line["error"]["code"] == "batch_expired")
    assert len(expired) == batch["request_counts"]["failed"] > 0
    answer = _retry(server, batch["id"], {"codes": ["batch_expired"]})
    assert answer.status_code == 200, answer.text
    taken = [orjson.loads(x)["custom_id"] for x in _input_lines(server, answer.json())]
    assert taken == expired  # in input order, which sorts the same here
    assert answer.json()["metadata"] == {"retry_of": batch["id"]}  # the source had no tags
    # The retry runs through the open gate; it ends here, not in the server's drain at teardown (after the engine's
    # reset has closed the gate again).
    server.wait(answer.json()["id"])


def test_a_create_rerun_with_its_key_finds_the_first_batch_not_its_retry(server, engine, tmp_path):
    """`orl batches create --idempotency-key K` tags the batch with K, and a retry keeps the tags: the create run
    again must still find the first batch's input, not the retry's."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(orjson.dumps(chat("k-ok", "fine")) + b"\n" + orjson.dumps(chat("k-bad", "no #status=400")) + b"\n")
    args = ("batches", "create", "--input-file", str(path), "--idempotency-key", "nightly-7")
    first = server.orl(*args)
    assert first.returncode == 0, first.stderr
    batch = server.wait(orjson.loads(first.stdout)["id"])
    retried = server.orl("batches", "retry", batch["id"])
    assert retried.returncode == 0, retried.stderr
    assert "nightly-7" in orjson.loads(retried.stdout)["metadata"]["tags"]
    again = server.orl(*args)
    assert again.returncode == 0, again.stderr
    assert orjson.loads(again.stdout)["id"] == batch["id"] and "uploaded" not in again.stderr
