"""`orl serve --blob-url s3://...` against a real SeaweedFS: a batch from upload to results with every byte in the
bucket and none in the server's data directory."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.support.batches import chat, jsonl, upload
from tests.support.forked import ORL
from tests.support.seaweed import S3Bucket, s3_bucket, seaweed  # noqa: F401  (session fixtures)
from tests.support.server import Server

pytestmark = pytest.mark.slow  # SeaweedFS

BIG_TEXT = "x" * 1_000_000  # nine of these make an input and an output past one 8 MiB part: multipart both ways
# What orl serve itself keeps in its data dir besides blobs (the SQLite store, the catalog, its log, its key).
NOT_BLOBS = {"openrelay.db", "openrelay.db-wal", "openrelay.db-shm", "catalog.toml", "serve.log", "api-key"}


def test_a_batch_runs_with_every_byte_in_the_bucket(make_server: Callable[..., Server],
                                                    s3_bucket: S3Bucket) -> None:  # noqa: F811
    prefix = "serve-" + secrets.token_hex(4)
    server = make_server(args=("--blob-url", s3_bucket.url(prefix)),
                         env={**s3_bucket.server.env(), "OPENRELAY_FLUSH_RECORDS": "2"})
    records = [chat(f"big-{i}", text=BIG_TEXT) for i in range(9)] + [chat("refused", text="#status=400")]
    content = jsonl(*records, b"{not json")
    file_id = upload(server, content)
    assert s3_bucket.keys(prefix + "/") == [f"{prefix}/files/{file_id}"]

    client = server.client()
    assert client.files.content(file_id).content == content
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.model_extra is not None and batch.model_extra["rejected_count"] == 1
    done = server.wait(batch.id)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 11, "completed": 9, "failed": 2}

    output = client.files.content(done["output_file_id"]).content
    lines = [orjson.loads(raw) for raw in output.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"big-{i}" for i in range(9)]
    assert all(line["response"]["body"]["choices"][0]["message"]["content"] == "echo: " + BIG_TEXT
               for line in lines)
    assert len(output) > 9_000_000
    errors = [orjson.loads(raw) for raw in client.files.content(done["error_file_id"]).content.splitlines()]
    assert sorted(line["custom_id"] for line in errors) == ["", "refused"]  # the unparsable line has no custom_id
    rejections = client.files.content(batch.model_extra["rejected_records_file_id"]).content
    assert b"invalid_json" in rejections

    # Chunks composed into the two result files and removed; nothing else left behind.
    assert s3_bucket.keys(prefix + "/") == sorted(
        f"{prefix}/{key}" for key in (f"files/{file_id}", f"batches/{batch.id}/rejections.jsonl",
                                      f"batches/{batch.id}/output.jsonl", f"batches/{batch.id}/error.jsonl"))
    assert s3_bucket.server.uploads_in_progress(s3_bucket.name) == []
    assert _blob_files_in(server.data_dir) == []

    # Deleting a file removes its object.
    assert client.files.delete(file_id).deleted
    assert f"{prefix}/files/{file_id}" not in s3_bucket.keys(prefix + "/")
    assert _blob_files_in(server.data_dir) == []


def _blob_files_in(data_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file() and p.name not in NOT_BLOBS)


def test_a_bad_blob_url_stops_the_process_with_exit_2(s3_bucket: S3Bucket, tmp_path: Path) -> None:  # noqa: F811
    env = {**os.environ, **s3_bucket.server.env()}
    for command, url, says in [
        (("worker",), "s3://no-such-bucket-here/x", "cannot be listed"),
        (("serve", "--port", "1"), "ftp://host/x", "expected s3://BUCKET/PREFIX"),
    ]:
        done = subprocess.run([ORL, *command, "--data-dir", str(tmp_path), "--blob-url", url], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr and "Traceback" not in done.stderr
