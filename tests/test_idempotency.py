"""Idempotent creates (docs/api-contract.md §5), over real HTTP.

A create is held mid-flight without any timing guess: its input file's blob is swapped for a FIFO, so the
server's read of the input blocks until the test writes into it. The test knows the server got there when its
own open of the FIFO for writing succeeds, which is after the key was claimed (the input is read in step 6,
the key claimed in step 3).
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import sqlalchemy as sa

from openrelay.store.db import Database
from openrelay.store.schema import idempotency_keys
from tests.support.batches import CHAT, batch_ids, chat, error_of, file_ids, jsonl, org_key, upload, wait_for
from tests.support.server import Server, free_port

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def _body(**fields: Any) -> bytes:
    return orjson.dumps({"endpoint": CHAT, "completion_window": "24h", **fields})


def _inline(*custom_ids: str, **fields: Any) -> bytes:
    return _body(requests=[chat(c, text=f"idem {c}") for c in custom_ids], **fields)


def _post(server: Server, body: bytes, key: str | bytes | None, api_key: str | None = None) -> httpx.Response:
    """POST /v1/batches with exactly these body bytes and this Idempotency-Key (None: no header)."""
    headers: dict[str, Any] = {"content-type": "application/json"}
    if key is not None:
        headers["idempotency-key"] = key
    return server.http("POST", "/batches", api_key=api_key, content=body, headers=headers)


def _ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    return resp.json()


def _not_in_use(resp: httpx.Response) -> httpx.Response | None:
    """The answer, or None while it is the 409 of a claim another create still holds."""
    if resp.status_code == 409:
        error_of(resp, 409, "idempotency_key_in_use")
        return None
    return resp


def _open_fifo_when_read(path: Path) -> int:
    """Open ``path`` (a FIFO) for writing; this succeeds only once a reader (the server) has it open."""
    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        os.set_blocking(fd, True)
        return fd


@contextmanager
def _held_create(server: Server, content: bytes, key: str) -> Iterator[tuple[bytes, Future[httpx.Response]]]:
    """A create under ``key`` from an uploaded file, stopped while it reads its input; released on exit.

    Yields the create's body and the future of its answer. Inside the block the key is claimed and the create
    still running. The blob's path holds a plain copy of the content again from the start of the block, so the
    worker that later runs the batch reads a normal file; only the held create reads the FIFO.
    """
    file_id = upload(server, content)
    blob = server.data_dir / "blobs" / "files" / file_id
    blob.unlink()
    os.mkfifo(blob)
    body = _body(input_file_id=file_id)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_post, server, body, key)
        fd = _open_fifo_when_read(blob)
        try:
            plain = blob.with_name(f".plain-{file_id}")
            plain.write_bytes(content)
            os.replace(plain, blob)
            yield body, first
        finally:
            try:
                os.write(fd, content)
            except BrokenPipeError:  # the server is gone (killed): nobody reads any more
                pass
            os.close(fd)


def _twin(server: Server) -> Server:
    """A second `orl serve` on the same store (database and blobs): a second process answering creates."""
    twin = Server(data_dir=server.data_dir, database_url=server.database_url, port=free_port(), env=server.env,
                  args=server.args, api_key=server.api_key)
    return twin.start()


# -- replay ---------------------------------------------------------------------------------------------------


def test_same_key_and_body_replays_the_stored_200_byte_for_byte(server, engine):
    body = _inline("a", "b", "b")  # the duplicate custom_ids are rejected, one record runs
    before = file_ids(server)
    first = _post(server, body, "nightly-summaries-2026-10-15")
    batch = _ok(first)
    assert batch["rejected_count"] == 2 and batch["rejected_records_file_id"]
    # The inline input and the rejections file (the batch may have run and written its result files already).
    results = {f"file-{batch['id']}-output", f"file-{batch['id']}-error"}
    made = file_ids(server) - before - results
    assert len(made) == 2

    again = _post(server, body, "nightly-summaries-2026-10-15")
    assert again.status_code == 200
    assert again.headers["content-type"] == "application/json"
    assert again.content == first.content
    assert batch_ids(server) == [batch["id"]]
    assert file_ids(server) - before - results == made  # no second input or rejections file either

    done = server.wait(batch["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    # The stored 200 is what is replayed, not the batch as it is now: still "validating", same bytes.
    late = _post(server, body, "nightly-summaries-2026-10-15")
    assert late.content == first.content and late.json()["status"] == "validating"
    assert batch_ids(server) == [batch["id"]]
    # The accepted record ran once.
    assert [r["body"]["messages"][0]["content"] for r in engine.requests()] == ["idem a"]


def test_sdk_retry_reusing_the_file_id_replays_and_a_new_upload_is_422(server):
    client = server.client()
    content = jsonl(chat("req-1"), chat("req-2"))
    first_file = client.files.create(file=("requests.jsonl", content), purpose="batch")
    headers = {"Idempotency-Key": "sdk-retry"}
    args = {"endpoint": CHAT, "completion_window": "24h", "extra_headers": headers}
    first = client.batches.create(input_file_id=first_file.id, **args)
    retry = client.batches.create(input_file_id=first_file.id, **args)
    assert retry.id == first.id
    # Uploading again makes a new file id: a different body under the same key.
    second_file = client.files.create(file=("requests.jsonl", content), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.batches.create(input_file_id=second_file.id, **args)
    assert refused.value.code == "idempotency_key_reused"
    assert [b.id for b in client.batches.list()] == [first.id]


def test_same_key_other_body_is_422_and_the_stored_200_stays(server):
    body = _inline("a", "b")
    first = _post(server, body, "k-other")
    batch = _ok(first)
    # Byte-identical is the rule: the same JSON spelled with other whitespace is another body.
    spaced = json.dumps(orjson.loads(body), indent=1).encode()
    for other in (spaced, _inline("a", "c"), _inline("a", "b", metadata={"job": "x"})):
        error_of(_post(server, other, "k-other"), 422, "idempotency_key_reused")
    # Refusals go by the key before the body: a malformed body is "another body" too.
    error_of(_post(server, b"{not json", "k-other"), 422, "idempotency_key_reused")
    assert batch_ids(server) == [batch["id"]]
    assert _post(server, body, "k-other").content == first.content


# -- in use -----------------------------------------------------------------------------------------------------


def test_409_while_the_first_create_is_still_running(server):
    content = jsonl(chat("a"), chat("b"))
    with _held_create(server, content, "held") as (body, first):
        error_of(_post(server, body, "held"), 409, "idempotency_key_in_use")
        error_of(_post(server, _inline("a"), "held"), 422, "idempotency_key_reused")
        assert batch_ids(server) == []
        assert not first.done()
    answer = first.result()
    batch = _ok(answer)
    assert _post(server, body, "held").content == answer.content
    assert batch_ids(server) == [batch["id"]]
    assert server.wait(batch["id"])["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


def test_a_claim_left_by_a_killed_server_is_taken_over_once_stale(make_server):
    server = make_server()  # claims go stale after the default 300 s
    content = jsonl(chat("a"))
    with _held_create(server, content, "crashed") as (body, first):
        error_of(_post(server, body, "crashed"), 409, "idempotency_key_in_use")
        server.kill()
    with pytest.raises(httpx.HTTPError):
        first.result()
    server.start()
    # A fresh claim of a dead create still blocks: the server cannot tell it from a slow one.
    error_of(_post(server, body, "crashed"), 409, "idempotency_key_in_use")
    assert batch_ids(server) == []
    server.stop()
    server.env["OPENRELAY_IDEMPOTENCY_CLAIM_SECONDS"] = "1"
    server.start()
    # The dead claim (made before the kill and two restarts) is taken over once it is 1 s old; until then each
    # retry is the same 409, and makes nothing.
    answer = wait_for(lambda: _not_in_use(_post(server, body, "crashed")), "the dead claim to go stale")
    batch = _ok(answer)
    assert _post(server, body, "crashed").content == answer.content
    assert batch_ids(server) == [batch["id"]]


def test_concurrent_creates_with_one_key_make_one_batch_across_two_servers(server):
    twin = _twin(server)
    try:
        keys = [f"race-{i}" for i in range(4)]
        per_key = 8
        start = threading.Barrier(len(keys) * per_key)

        def fire(i: int) -> tuple[str, httpx.Response]:
            key = keys[i % len(keys)]
            start.wait()
            target = server if (i // len(keys)) % 2 else twin  # each key: half its requests to each process
            return key, _post(target, _inline("a", "b", metadata={"k": key}), key)

        with ThreadPoolExecutor(len(keys) * per_key) as pool:
            answers = list(pool.map(fire, range(len(keys) * per_key)))
        ids = set(batch_ids(server))
        assert len(ids) == len(keys)
        for key in keys:
            mine = [resp for k, resp in answers if k == key]
            created = [resp for resp in mine if resp.status_code == 200]
            assert created, [resp.text for resp in mine]
            assert len({resp.content for resp in created}) == 1  # every 200 is the one stored answer
            for resp in mine:
                if resp.status_code != 200:
                    error_of(resp, 409, "idempotency_key_in_use")
            # A retry once the race is over replays it, from either process.
            for target in (server, twin):
                assert _post(target, _inline("a", "b", metadata={"k": key}), key).content == created[0].content
            assert created[0].json()["id"] in ids
    finally:
        twin.stop()


# -- a failed create keeps nothing ----------------------------------------------------------------------------


def test_only_a_200_is_stored_a_failed_create_frees_the_key(server):
    off = server.admin("org", "set", server.org, "--expedited", "off")
    assert off.returncode == 0, off.stderr
    body = _inline("a", priority="expedited")
    error_of(_post(server, body, "k-fail"), 409, "feature_disabled")
    error_of(_post(server, body, "k-fail"), 409, "feature_disabled")  # the refusal is not replayed: it ran again
    on = server.admin("org", "set", server.org, "--expedited", "on")
    assert on.returncode == 0, on.stderr
    batch = _ok(_post(server, body, "k-fail"))
    assert batch["priority"] == "expedited"

    # A refused create binds the key to nothing: a retry with another body runs too.
    error_of(_post(server, _body(input_file_id="file-000000000000000000000000"), "k-404"), 404, "not_found",
             param="file_id")
    error_of(_post(server, _body(requests=[chat("x", model="nope/none")]), "k-404"), 400, "no_valid_records")
    other = _ok(_post(server, _inline("y"), "k-404"))
    assert sorted(batch_ids(server)) == sorted([batch["id"], other["id"]])


# -- scope, order and shape -------------------------------------------------------------------------------------


def test_keys_belong_to_the_organization(server):
    body = _inline("a")
    mine = _ok(_post(server, body, "shared-key"))
    theirs_key = server.new_org_key()
    theirs = _ok(_post(server, body, "shared-key", api_key=theirs_key))
    assert theirs["id"] != mine["id"]
    # Another organization's use of the key does not bind this one's body either.
    other = _ok(_post(server, _inline("b"), "only-theirs", api_key=theirs_key))
    assert _ok(_post(server, _inline("c"), "only-theirs"))["id"] != other["id"]
    assert _post(server, body, "shared-key").json()["id"] == mine["id"]
    assert _post(server, body, "shared-key", api_key=theirs_key).json()["id"] == theirs["id"]
    assert set(batch_ids(server, api_key=theirs_key)) == {theirs["id"], other["id"]}
    assert mine["id"] in batch_ids(server) and theirs["id"] not in batch_ids(server)


def test_key_is_1_to_512_bytes(server):
    def refused(key: str | bytes) -> None:
        err = error_of(_post(server, _inline("a"), key), 400, "invalid_request_error", param="Idempotency-Key")
        assert "1 to 512 bytes" in err["message"]

    refused("")
    refused("k" * 513)
    refused(b"\xc3\xa9" * 257)  # 257 characters "é" in UTF-8: 514 bytes
    assert batch_ids(server) == []
    longest = _ok(_post(server, _inline("a"), "k" * 512))
    wide = _ok(_post(server, _inline("a"), b"\xc3\xa9" * 256))  # 512 bytes
    assert _post(server, _inline("a"), b"\xc3\xa9" * 256).json()["id"] == wide["id"]
    assert sorted(batch_ids(server)) == sorted([longest["id"], wide["id"]])


def test_scope_and_budget_are_checked_before_the_key(server):
    content = jsonl(chat("a"))
    body = _body(input_file_id=upload(server, content))
    first = _post(server, body, "k-scoped")
    batch = _ok(first)
    no_write = org_key(server, server.org, "--scopes", "batch.read,files.read,files.write")
    no_files_read = org_key(server, server.org, "--scopes", "batch.read,batch.write,files.write")
    spent = org_key(server, server.org, "--budget-usd", "0")
    for api_key in (no_write, no_files_read):
        error_of(_post(server, body, "k-scoped", api_key=api_key), 403, "insufficient_scope",
                 type_="permission_error")
    error_of(_post(server, body, "k-scoped", api_key=spent), 402, "key_budget_exceeded", type_="insufficient_quota")
    error_of(_post(server, b"{not json", "k-scoped", api_key=no_write), 403, "insufficient_scope",
             type_="permission_error")
    # The key belongs to the organization, so another key of it with every scope gets the stored answer.
    assert _post(server, body, "k-scoped", api_key=org_key(server, server.org)).content == first.content
    assert batch_ids(server) == [batch["id"]]


# -- expiry ---------------------------------------------------------------------------------------------------


def _stored_keys(server: Server) -> set[str]:
    db = Database(server.database_url)
    try:
        with db.read() as conn:
            return set(conn.execute(sa.select(idempotency_keys.c.idempotency_key)).scalars())
    finally:
        db.dispose()


def test_after_the_window_the_key_creates_a_new_batch_and_old_keys_are_purged(make_server):
    server = make_server(env={"OPENRELAY_IDEMPOTENCY_SECONDS": "1"})
    body = _inline("a")
    _ok(_post(server, _inline("b"), "k-other"))  # first, so it has expired by the time "k-expiring" has
    first = _ok(_post(server, body, "k-expiring"))
    # Within its 1 s window a retry replays the first answer (and makes nothing); past it, it creates anew.
    again = wait_for(lambda: (made := _ok(_post(server, body, "k-expiring")))["id"] != first["id"] and made,
                     "the key's window to pass")
    assert again["id"] != first["id"]
    # The create purged every expired key: "k-other" is gone, and "k-expiring" holds the new answer.
    assert _stored_keys(server) == {"k-expiring"}
    assert len(batch_ids(server)) == 3


# -- CLI --------------------------------------------------------------------------------------------------------


def _cli_input(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(chat("req-1"), chat("req-2")))
    return path


def _uploads(server: Server) -> list[str]:
    return [f["id"] for f in _ok(server.http("GET", "/files", params={"purpose": "batch"}))["data"]]


def test_cli_retry_finds_the_first_batch_before_uploading(server, tmp_path):
    args = ("batches", "create", "--input-file", str(_cli_input(tmp_path)), "--idempotency-key", "cli-key",
            "--metadata", "job=sum")
    first = server.orl(*args)
    assert first.returncode == 0, first.stderr
    batch = orjson.loads(first.stdout)
    uploads = _uploads(server)
    retry = server.orl(*args)
    assert retry.returncode == 0, retry.stderr
    assert retry.stdout == first.stdout  # the server's stored 200, printed again
    assert "uploaded" in first.stderr and "uploaded" not in retry.stderr
    assert f"batch {batch['id']} already has idempotency key 'cli-key'" in retry.stderr
    assert _uploads(server) == uploads == [batch["input_file_id"]]
    assert batch_ids(server) == [batch["id"]]


def test_cli_key_without_batch_read_still_creates(server, tmp_path):
    writer = org_key(server, server.org, "--scopes", "batch.write,files.read,files.write")
    args = ("batches", "create", "--input-file", str(_cli_input(tmp_path)), "--idempotency-key", "cli-blind")
    first = server.orl(*args, api_key=writer)
    assert first.returncode == 0, first.stderr
    assert "cannot look for an earlier batch" in first.stderr
    batch = orjson.loads(first.stdout)
    # Unable to find the first batch, a retry uploads the file again: a new file id under the same key is
    # another body, refused with 422 (exit 2) rather than run twice.
    retry = server.orl(*args, api_key=writer)
    assert retry.returncode == 2, retry.stderr
    assert orjson.loads(retry.stdout)["error"]["code"] == "idempotency_key_reused"
    assert batch_ids(server) == [batch["id"]]
