"""`orl` end to end: the real binary as a subprocess against a real `orl serve` (docs/api-contract.md §9)."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from tests.support.batches import wait_letting_held_through
from tests.support.cli import ok, refused
from tests.support.forked import ORL
from tests.support.server import free_port

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

CHAT = "/v1/chat/completions"


def _record(custom_id: str, text: str = "hi", model: str = "test/echo", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body, **extra}


def _jsonl(path: Path, records: list[dict[str, Any] | bytes]) -> Path:
    lines = [r if isinstance(r, bytes) else orjson.dumps(r) for r in records]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _good(path: Path, n: int = 2, text: str = "hello") -> Path:
    return _jsonl(path, [_record(f"req-{i}", f"{text} {i}") for i in range(1, n + 1)])


def _bad_records() -> list[tuple[dict[str, Any] | bytes, str]]:
    """Twelve records, each broken one way, with the code the create must give it."""

    def without(key: str) -> dict[str, Any]:
        rec = _record("x")
        del rec[key]
        return rec

    def body_with(custom_id: str, **fields: Any) -> dict[str, Any]:
        rec = _record(custom_id)
        rec["body"].update(fields)
        return rec

    no_model = _record("bad-nomodel")
    del no_model["body"]["model"]
    no_body = _record("bad-nobody")
    del no_body["body"]
    no_custom_id = without("custom_id")
    return [
        (b"{not json", "invalid_json"),
        (no_custom_id, "missing_custom_id"),
        ({**_record("bad-method"), "method": "GET"}, "invalid_method"),
        ({**_record("bad-url"), "url": "/v1/embeddings"}, "url_mismatch"),
        (no_body, "invalid_body"),
        (body_with("bad-stream", stream=True), "streaming_unsupported"),
        (no_model, "missing_model"),
        (_record("bad-model", model="nope/never"), "model_not_offered"),
        (body_with("bad-ext", openrelay={"surprise": 1}), "unknown_extension"),
        (body_with("bad-toolcfg", tool_config={"servers": []}), "tool_config_moved"),
        (_record("bad-embed", model="test/embed"), "model_endpoint_mismatch"),
        (b"[1, 2]", "invalid_json"),
    ]


def _create(server, path: Path, *args: str, api_key: str | None = None) -> dict[str, Any]:
    return ok(server.orl("batches", "create", "--input-file", str(path), *args, api_key=api_key))


def _preview_lines(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.strip().startswith("line ")]


# -- batches create --------------------------------------------------------------------------------------


def test_create_from_input_file(server, tmp_path):
    path = _good(tmp_path / "in.jsonl", 3)
    done = server.orl("batches", "create", "--input-file", str(path))
    batch = ok(done)
    assert batch["id"].startswith("batch_") and batch["object"] == "batch"
    assert batch["endpoint"] == CHAT and batch["completion_window"] == "24h"
    assert batch["status"] == "validating" and batch["priority"] == "standard"
    assert batch["model"] == "test/echo"
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch["rejected_count"] == 0
    # The upload really happened: the batch names a stored file whose bytes are the input.
    file_id = batch["input_file_id"]
    assert file_id in done.stderr
    assert server.http("GET", f"/files/{file_id}/content").content == path.read_bytes()
    assert "rejected" not in done.stderr
    assert server.wait(batch["id"])["status"] == "completed"


def test_create_with_rejections_previews_ten_and_writes_all(server, tmp_path):
    bad = _bad_records()
    path = _jsonl(tmp_path / "mixed.jsonl", [_record("ok-1"), _record("ok-2"), *(rec for rec, _ in bad)])
    out = tmp_path / "rejections.jsonl"
    # The endpoint is given: one record names another url (url_mismatch), so it cannot be taken from the records.
    done = server.orl("batches", "create", "--input-file", str(path), "--endpoint", CHAT, "--rejections-out", str(out))
    batch = ok(done)
    assert batch["rejected_count"] == 12
    assert batch["request_counts"] == {"total": 14, "completed": 0, "failed": 12}
    file_id = batch["rejected_records_file_id"]
    assert file_id

    # stderr: a preview of the first ten (lines 3..12), how many more, and the rejections file id.
    preview = _preview_lines(done.stderr)
    assert len(preview) == 10, done.stderr
    for line_no, text in zip(range(3, 13), preview, strict=True):
        assert text.startswith(f"line {line_no} "), text
        assert bad[line_no - 3][1] in text
    assert "line 13 " not in done.stderr and "line 14 " not in done.stderr
    assert "... and 2 more" in done.stderr
    assert "12 record" in done.stderr
    assert file_id in done.stderr
    # stdout is the batch alone: the preview never leaks into it.
    assert "... and" not in done.stdout

    # --rejections-out: every rejection, in line order, the same objects as the server's file.
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 12
    assert [r["line"] for r in rows] == list(range(3, 15))
    assert [r["code"] for r in rows] == [code for _, code in bad]
    for row in rows:
        assert set(row) == {"line", "custom_id", "code", "message"}
        assert isinstance(row["message"], str) and row["message"]
    assert rows[0]["custom_id"] == "" and rows[5]["custom_id"] == "bad-stream"
    assert rows[5]["message"] == '"stream": true is not supported in batch'
    assert out.read_bytes() == server.http("GET", f"/files/{file_id}/content").content

    final = server.wait(batch["id"])
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 14, "completed": 2, "failed": 12}


def test_create_all_rejected_exits_2_with_preview_and_file(server, tmp_path):
    bad = _bad_records()
    path = _jsonl(tmp_path / "bad.jsonl", [rec for rec, _ in bad])
    out = tmp_path / "rejections.jsonl"
    done = server.orl("batches", "create", "--input-file", str(path), "--endpoint", CHAT, "--rejections-out", str(out))
    err = refused(done, 2, "no_valid_records")
    assert err["rejected_count"] == 12
    assert err["message"] == "all 12 records were rejected; see rejected_records"
    preview = _preview_lines(done.stderr)
    assert len(preview) == 10 and preview[0].startswith("line 1 ") and preview[-1].startswith("line 10 ")
    assert "... and 2 more" in done.stderr
    assert err["rejected_records_file_id"] in done.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in rows] == list(range(1, 13))
    assert [r["code"] for r in rows] == [code for _, code in bad]
    # No batch was created.
    assert ok(server.orl("batches", "list"))["data"] == []


def test_create_from_input_file_id_with_metadata_and_priority(server, tmp_path):
    path = _good(tmp_path / "in.jsonl", 2)
    uploaded = ok(server.orl("files", "upload", str(path)))
    done = server.orl("batches", "create", "--input-file-id", uploaded["id"], "--endpoint", CHAT,
                      "--metadata", "job=nightly", "--metadata", "tags=alpha,beta", "--metadata", "eq=a=b",
                      "--priority", "expedited")
    batch = ok(done)
    assert batch["input_file_id"] == uploaded["id"]
    assert batch["metadata"] == {"job": "nightly", "tags": "alpha,beta", "eq": "a=b"}
    assert batch["priority"] == "expedited"
    # Read back through `orl batches get`.
    again = ok(server.orl("batches", "get", batch["id"]))
    assert again["id"] == batch["id"]
    assert again["priority"] == "expedited"
    assert again["metadata"] == {"job": "nightly", "tags": "alpha,beta", "eq": "a=b"}


def test_idempotency_key_tags_and_retry_reuses_the_input_file(server, tmp_path):
    path = _good(tmp_path / "in.jsonl", 2)
    key = "nightly-summaries-2026-10-15"
    args = ("batches", "create", "--input-file", str(path), "--idempotency-key", key,
            "--metadata", "tags=nightly", "--metadata", "job=sum")
    first_run = server.orl(*args)
    first = ok(first_run)
    assert first["metadata"] == {"tags": f"nightly,{key}", "job": "sum"}
    assert [b["id"] for b in ok(server.orl("batches", "list", "--tag", key))["data"]] == [first["id"]]
    # The retry finds the first batch by its tag and does not upload the file again, so the create body is
    # byte-identical to the first one (what the server's idempotency replay needs).
    retry_run = server.orl(*args)
    retry = ok(retry_run)
    assert retry["input_file_id"] == first["input_file_id"]
    assert retry["metadata"] == first["metadata"]
    assert "uploaded" in first_run.stderr and "uploaded" not in retry_run.stderr
    assert first["id"] in retry_run.stderr
    uploads = ok(server.orl("files", "list", "--purpose", "batch"))["data"]
    assert [f["id"] for f in uploads] == [first["input_file_id"]]
    # Without a key, nothing is looked up: a fresh upload.
    plain_run = server.orl("batches", "create", "--input-file", str(path), "--metadata", "job=sum")
    plain = ok(plain_run)
    assert plain["input_file_id"] != first["input_file_id"] and "uploaded" in plain_run.stderr
    assert plain["metadata"] == {"job": "sum"}


def test_expedited_disabled_exits_6(server, tmp_path):
    path = _good(tmp_path / "in.jsonl", 1)
    off = server.admin("org", "set", server.org, "--expedited", "off")
    assert off.returncode == 0, off.stderr
    done = server.orl("batches", "create", "--input-file", str(path), "--priority", "expedited")
    err = refused(done, 6, "feature_disabled")
    assert err["message"] == 'priority "expedited" is not enabled for this organization'
    assert ok(server.orl("batches", "list"))["data"] == []
    # Standard still works for the same organization.
    assert _create(server, path)["priority"] == "standard"


# -- refusals and their exit codes -----------------------------------------------------------------------


def test_get_unknown_batch_exits_4(server):
    err = refused(server.orl("batches", "get", "batch_000000000000"), 4, "not_found")
    assert err["message"]


def test_bad_api_key_exits_3(server):
    done = server.orl("batches", "list", api_key="orl-not-a-real-key")
    refused(done, 3, "invalid_api_key")


def test_missing_scope_exits_3(server, tmp_path):
    path = _good(tmp_path / "in.jsonl", 1)
    file_id = ok(server.orl("files", "upload", str(path)))["id"]
    made = server.admin("key", "create", "--org", server.org, "--scopes", "batch.read,files.read")
    assert made.returncode == 0, made.stderr
    reader = made.stdout.strip()
    done = server.orl("batches", "create", "--input-file-id", file_id, api_key=reader)
    refused(done, 3, "insufficient_scope")
    # The same key may read.
    assert ok(server.orl("batches", "list", api_key=reader))["data"] == []


def test_cancel_terminal_batch_exits_7(server, tmp_path):
    batch = _create(server, _good(tmp_path / "in.jsonl", 1))
    assert server.wait(batch["id"])["status"] == "completed"
    refused(server.orl("batches", "cancel", batch["id"]), 7, "batch_terminal")
    assert ok(server.orl("batches", "get", batch["id"]))["status"] == "completed"


def test_server_down_exits_1(tmp_path):
    env = {**os.environ, "OPENRELAY_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "OPENRELAY_API_KEY": "orl-x"}
    done = subprocess.run([ORL, "batches", "list"], env=env, capture_output=True, text=True, timeout=60)
    refused(done, 1, None)
    assert "cannot talk to" in done.stderr
    path = _good(tmp_path / "in.jsonl", 1)
    done = subprocess.run([ORL, "batches", "create", "--input-file", str(path)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done


# -- list, metadata, cancel, wait ------------------------------------------------------------------------


def test_list_paging_and_filters(server, engine, tmp_path):
    path = _good(tmp_path / "in.jsonl", 1)
    first = _create(server, path, "--metadata", "tags=red,green")
    assert server.wait(first["id"])["status"] == "completed"
    second = _create(server, path, "--metadata", "tags=green")
    third = _create(server, path, "--metadata", "tags=blue")
    for b in (second, third):
        assert server.wait(b["id"])["status"] == "completed"

    page = ok(server.orl("batches", "list", "--limit", "2"))
    assert page["object"] == "list"
    assert [b["id"] for b in page["data"]] == [third["id"], second["id"]]
    assert page["has_more"] is True and page["last_id"] == second["id"]
    rest = ok(server.orl("batches", "list", "--limit", "2", "--after", page["last_id"]))
    assert [b["id"] for b in rest["data"]] == [first["id"]]
    assert rest["has_more"] is False

    green = ok(server.orl("batches", "list", "--tag", "green"))
    assert [b["id"] for b in green["data"]] == [second["id"], first["id"]]
    red = ok(server.orl("batches", "list", "--tag", "red"))
    assert [b["id"] for b in red["data"]] == [first["id"]]

    # A fourth batch, cancelled while it runs: the status filter tells it apart.
    slow = _jsonl(tmp_path / "slow.jsonl", [_record(f"s-{i}", "wait #hold=s") for i in range(40)])
    running = _create(server, slow)
    engine.wait_held("s")
    done = ok(server.orl("batches", "list", "--status", "completed"))
    assert {b["id"] for b in done["data"]} == {first["id"], second["id"], third["id"]}
    assert all(b["status"] == "completed" for b in done["data"])
    cancelled = ok(server.orl("batches", "cancel", running["id"]))
    assert cancelled["status"] in ("cancelling", "cancelled")
    assert wait_letting_held_through(server, engine, "s", running["id"])["status"] == "cancelled"
    only = ok(server.orl("batches", "list", "--status", "cancelled"))
    assert [b["id"] for b in only["data"]] == [running["id"]]


def test_metadata_replace_and_clear(server, tmp_path):
    batch = _create(server, _good(tmp_path / "in.jsonl", 1), "--metadata", "job=one", "--metadata", "keep=me")
    replaced = ok(server.orl("batches", "metadata", batch["id"], "job=two", "tags=x,y"))
    assert replaced["metadata"] == {"job": "two", "tags": "x,y"}
    assert ok(server.orl("batches", "get", batch["id"]))["metadata"] == {"job": "two", "tags": "x,y"}
    assert [b["id"] for b in ok(server.orl("batches", "list", "--tag", "y"))["data"]] == [batch["id"]]
    # Without pairs it only shows the map (a newcomer types that to look); emptying it takes --clear.
    assert ok(server.orl("batches", "metadata", batch["id"])) == {"job": "two", "tags": "x,y"}
    assert ok(server.orl("batches", "get", batch["id"]))["metadata"] == {"job": "two", "tags": "x,y"}
    both = server.orl("batches", "metadata", batch["id"], "--clear", "job=three")
    assert both.returncode == 2 and "not both" in both.stderr
    cleared = ok(server.orl("batches", "metadata", batch["id"], "--clear"))
    assert not cleared["metadata"]
    assert not ok(server.orl("batches", "get", batch["id"]))["metadata"]
    assert ok(server.orl("batches", "metadata", batch["id"])) == {}
    # Unknown batch: 404, exit 4.
    assert server.orl("batches", "metadata", "batch_000000000000", "a=b").returncode == 4
    # A malformed pair is a usage error, not a request.
    bad = server.orl("batches", "metadata", batch["id"], "novalue")
    assert bad.returncode not in (0, 1) and "key=value" in bad.stderr


def test_cancel_running_batch(server, engine, tmp_path):
    path = _jsonl(tmp_path / "slow.jsonl", [_record(f"s-{i}", "slow #hold=s") for i in range(40)])
    batch = _create(server, path)
    engine.wait_held("s")
    cancelled = ok(server.orl("batches", "cancel", batch["id"]))
    assert cancelled["id"] == batch["id"]
    assert cancelled["status"] in ("cancelling", "cancelled")
    final = wait_letting_held_through(server, engine, "s", batch["id"])
    assert final["status"] == "cancelled"
    counts = final["request_counts"]
    assert counts["total"] == 40 and counts["completed"] + counts["failed"] == 40 and counts["failed"] > 0


def test_wait_until_terminal(server, engine, tmp_path):
    path = _jsonl(tmp_path / "in.jsonl", [_record(f"w-{i}", f"slowish {i} #hold=w") for i in range(3)])
    batch = _create(server, path)
    with ThreadPoolExecutor(1) as pool:  # `orl batches wait` starts while every record is held
        waiting = pool.submit(server.orl, "batches", "wait", batch["id"], "--interval", "0.2")
        engine.wait_held("w", 3)
        engine.release("w")
        done = waiting.result()
    final = ok(done)
    assert final["id"] == batch["id"] and final["status"] == "completed"
    assert final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    # Progress is on stderr, never on stdout.
    assert batch["id"] in done.stderr
    assert "completed" in done.stderr
    # Waiting on an unknown batch fails at once with exit 4.
    assert server.orl("batches", "wait", "batch_000000000000").returncode == 4


# -- files and models ------------------------------------------------------------------------------------


def test_files_upload_list_get_delete(server, tmp_path):
    path = _good(tmp_path / "upload.jsonl", 2)
    uploaded = ok(server.orl("files", "upload", str(path)))
    assert uploaded["id"].startswith("file-") and uploaded["purpose"] == "batch"
    assert uploaded["bytes"] == path.stat().st_size and uploaded["filename"] == "upload.jsonl"
    other = ok(server.orl("files", "upload", str(path)))
    assert other["id"] != uploaded["id"]  # no idempotency on uploads

    listed = ok(server.orl("files", "list"))
    assert [f["id"] for f in listed["data"]][:2] == [other["id"], uploaded["id"]]
    page = ok(server.orl("files", "list", "--limit", "1"))
    assert [f["id"] for f in page["data"]] == [other["id"]]
    after = ok(server.orl("files", "list", "--after", other["id"]))
    assert uploaded["id"] in [f["id"] for f in after["data"]] and other["id"] not in [f["id"] for f in after["data"]]

    got = ok(server.orl("files", "get", uploaded["id"]))
    assert got["id"] == uploaded["id"] and got["bytes"] == uploaded["bytes"]

    dest = tmp_path / "copy.jsonl"
    copied = ok(server.orl("files", "content", "get", uploaded["id"], "-o", str(dest)))
    assert copied == {"id": uploaded["id"], "path": str(dest.resolve()), "bytes": path.stat().st_size}
    assert dest.read_bytes() == path.read_bytes()

    deleted = ok(server.orl("files", "delete", uploaded["id"]))
    assert deleted["id"] == uploaded["id"] and deleted["deleted"] is True
    assert server.orl("files", "get", uploaded["id"]).returncode == 4
    assert uploaded["id"] not in [f["id"] for f in ok(server.orl("files", "list"))["data"]]
    missing = tmp_path / "missing.jsonl"
    gone = server.orl("files", "content", "get", uploaded["id"], "-o", str(missing))
    assert gone.returncode == 4 and not missing.exists()


def test_download_output_file_of_finished_batch(server, tmp_path):
    path = _jsonl(tmp_path / "in.jsonl", [_record(f"r-{i}", f"hello {i}") for i in range(5)]
                  + [_record("boom", "fail please #status=400")])
    batch = _create(server, path)
    waited = ok(server.orl("batches", "wait", batch["id"], "--interval", "0.1"))
    assert waited["status"] == "completed"
    assert waited["output_file_id"] == f"file-{batch['id']}-output"
    out = tmp_path / "results.jsonl"
    written = ok(server.orl("files", "content", "get", waited["output_file_id"], "-o", str(out)))
    server_bytes = server.http("GET", f"/files/{waited['output_file_id']}/content").content
    assert out.read_bytes() == server_bytes and server_bytes
    assert written["bytes"] == len(server_bytes) and written["id"] == waited["output_file_id"]
    assert not list(tmp_path.glob("*.part"))
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"r-{i}" for i in range(5)]
    errors = tmp_path / "errors.jsonl"
    assert waited["error_file_id"]
    ok(server.orl("files", "content", "get", waited["error_file_id"], "-o", str(errors)))
    assert errors.read_bytes() == server.http("GET", f"/files/{waited['error_file_id']}/content").content
    assert [json.loads(x)["custom_id"] for x in errors.read_text().splitlines()] == ["boom"]
    # `-o -` streams to stdout.
    to_stdout = server.orl("files", "content", "get", waited["output_file_id"], "-o", "-")
    assert to_stdout.returncode == 0 and to_stdout.stdout.encode() == server_bytes


def test_models_lists_catalog(server):
    models = ok(server.orl("models"))
    assert models["object"] == "list"
    by_id = {m["id"]: m for m in models["data"]}
    assert set(by_id) == {"test/echo", "test/embed"}
    assert CHAT in by_id["test/echo"]["endpoints"]
    assert by_id["test/embed"]["endpoints"] == ["/v1/embeddings"]
    assert all(m["object"] == "model" for m in models["data"])
