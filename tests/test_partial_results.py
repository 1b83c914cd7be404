"""Results while running (issue 14 part 2): ``file-<batch>-output`` and ``-error`` read before the batch ends,
through the API, the openai SDK and `orl batches results --follow`. Every read is a prefix of every later read
and of the final file: no line shown twice, none lost."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from openrelay.blobs.local import LocalBlobStore
from openrelay.blobs.s3 import S3BlobStore, S3Location
from openrelay.service.partial_results import PartialFile, parse_result_file_id, read_partial
from tests.support.batches import TERMINAL, chat, create, get, upload, wait_for
from tests.support.forked import ORL
from tests.support.seaweed import s3_bucket, seaweed  # noqa: F401  (session fixtures)

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def _file(server, file_id: str, api_key: str | None = None):
    return server.http("GET", f"/files/{file_id}", api_key=api_key)


def _content(server, file_id: str, **headers: str):
    return server.http("GET", f"/files/{file_id}/content", headers=headers)


def _lines(data: bytes) -> list[dict]:
    return [orjson.loads(line) for line in data.splitlines()]


def _when_lines(server, file_id: str, n: int) -> dict:
    """The file object once it holds ``n`` lines."""
    return wait_for(lambda: (f := _file(server, file_id).json()).get("openrelay", {}).get("lines") == n and f,
                    f"{file_id} to hold {n} lines")


def test_result_files_grow_while_running_each_read_a_prefix_of_the_next(server, engine):
    gate_ok, gate_bad = "pr-ok", "pr-bad"
    records = [chat(f"ok{i}", f"fine {i} #hold={gate_ok}") for i in range(4)]
    records += [chat(f"bad{i}", f"refused {i} #hold={gate_bad} #status=400") for i in range(2)]
    batch_id = create(server, records)["id"]
    out_id, err_id = f"file-{batch_id}-output", f"file-{batch_id}-error"
    engine.wait_held(gate_ok, 4)
    engine.wait_held(gate_bad, 2)

    # Nothing has finished: both files exist, empty and partial; the batch names neither.
    for file_id, kind in ((out_id, "output"), (err_id, "error")):
        found = _file(server, file_id)
        assert found.status_code == 200, found.text
        assert found.json() == {"id": file_id, "object": "file", "bytes": 0, "created_at": found.json()["created_at"],
                                "expires_at": None, "filename": f"{batch_id}_{kind}.jsonl", "purpose": "batch_output",
                                "status": "partial", "status_details": None,
                                "openrelay": {"partial": True, "lines": 0}}
        empty = _content(server, file_id)
        assert empty.status_code == 200 and empty.content == b""
    batch = get(server, batch_id)
    assert batch["output_file_id"] is None and batch["error_file_id"] is None

    engine.release(gate_ok, count=2)
    first = _when_lines(server, out_id, 2)
    c1 = _content(server, out_id)
    assert c1.status_code == 200 and len(c1.content) == first["bytes"] == int(c1.headers["content-length"])
    assert len(_lines(c1.content)) == 2 and all(line["error"] is None for line in _lines(c1.content))

    engine.release(gate_bad, count=1)
    _when_lines(server, err_id, 1)
    e1 = _content(server, err_id).content
    assert [line["error"]["status_code"] for line in _lines(e1)] == [400]

    engine.release(gate_ok, count=1)
    _when_lines(server, out_id, 3)
    c2 = _content(server, out_id).content
    assert c2.startswith(c1.content) and len(_lines(c2)) == 3
    batch = get(server, batch_id)
    assert batch["status"] == "in_progress" and batch["output_file_id"] is None

    # Range: bytes=N- gives what came after N; at the end there is nothing yet (416).
    tail = _content(server, out_id, range=f"bytes={len(c1.content)}-")
    assert tail.status_code == 206 and tail.content == c2[len(c1.content):]
    assert tail.headers["content-range"] == f"bytes {len(c1.content)}-{len(c2) - 1}/{len(c2)}"
    past = _content(server, out_id, range=f"bytes={len(c2)}-")
    assert past.status_code == 416 and past.json()["error"]["code"] == "range_not_satisfiable"
    assert past.headers["content-range"] == f"bytes */{len(c2)}"

    engine.release(gate_ok)
    engine.release(gate_bad)
    done = server.wait(batch_id)
    assert done["status"] == "completed"
    assert done["output_file_id"] == out_id and done["error_file_id"] == err_id
    final_out = _content(server, out_id).content
    final_err = _content(server, err_id).content
    assert final_out.startswith(c2) and final_err.startswith(e1)
    assert sorted(line["custom_id"] for line in _lines(final_out)) == [f"ok{i}" for i in range(4)]
    assert sorted(line["custom_id"] for line in _lines(final_err)) == ["bad0", "bad1"]
    ended = _file(server, out_id).json()
    assert ended["status"] == "processed" and "openrelay" not in ended and ended["bytes"] == len(final_out)


def test_single_ranges_of_every_form_answer_206(server, engine):
    """Issue 34 part 5: bytes=A-B, A- and -N each answer 206 with exactly those bytes, on an uploaded file, a
    running batch's partial result file and an ended one; a range the file has no byte of is 416; several ranges,
    another unit or an end before its start are ignored (200, the whole file)."""
    gate = "pr-ranges"
    batch_id = create(server, [chat(f"g{i}", f"ranged {i} #hold={gate}") for i in range(3)])["id"]
    out_id = f"file-{batch_id}-output"
    engine.wait_held(gate, 3)
    engine.release(gate, count=2)
    _when_lines(server, out_id, 2)
    partial = _content(server, out_id).content
    text = b"".join(b"{\"n\": %d}\n" % i for i in range(1000))
    uploaded = upload(server, text)

    def check(file_id: str, whole: bytes) -> None:
        size = len(whole)
        assert _content(server, file_id).headers["accept-ranges"] == "bytes"
        for asked, start, stop in (("bytes=0-99", 0, 100), ("bytes=0-0", 0, 1), ("bytes=-100", size - 100, size),
                                   ("bytes=10-", 10, size), (f"bytes={size - 1}-{size + 500}", size - 1, size),
                                   (f"bytes=-{size + 5}", 0, size), ("bytes=5-9", 5, 10)):
            answer = _content(server, file_id, range=asked)
            assert answer.status_code == 206, (file_id, asked, answer.status_code)
            assert answer.content == whole[start:stop], (file_id, asked)
            assert answer.headers["content-range"] == f"bytes {start}-{stop - 1}/{size}", (file_id, asked)
            assert int(answer.headers["content-length"]) == stop - start
        for asked in (f"bytes={size}-", f"bytes={size}-{size + 9}", "bytes=-0"):
            refused = _content(server, file_id, range=asked)
            assert refused.status_code == 416 and refused.json()["error"]["code"] == "range_not_satisfiable"
            assert refused.headers["content-range"] == f"bytes */{size}", asked
        for ignored in ("bytes=0-9,20-29", "items=0-9", "bytes=9-0", "bytes=-", "bytes=a-b"):
            answer = _content(server, file_id, range=ignored)
            assert answer.status_code == 200 and answer.content == whole, ignored

    check(uploaded, text)
    check(out_id, partial)
    engine.release(gate)
    assert server.wait(batch_id)["status"] == "completed"
    check(out_id, _content(server, out_id).content)


def test_sdk_reads_a_partial_file(server, engine):
    gate = "pr-sdk"
    batch_id = create(server, [chat(f"s{i}", f"sdk {i} #hold={gate}") for i in range(3)])["id"]
    engine.wait_held(gate, 3)
    engine.release(gate, count=1)
    _when_lines(server, f"file-{batch_id}-output", 1)
    client = server.client()
    found = client.files.retrieve(f"file-{batch_id}-output")
    assert found.status == "partial" and found.bytes > 0
    assert found.model_extra["openrelay"] == {"partial": True, "lines": 1}
    data = client.files.content(found.id).content
    assert len(data) == found.bytes and [line["custom_id"] for line in _lines(data)][0].startswith("s")
    assert client.batches.retrieve(batch_id).output_file_id is None
    engine.release(gate)
    assert server.wait(batch_id)["status"] == "completed"
    final = client.files.content(found.id).content
    assert final.startswith(data) and len(_lines(final)) == 3
    assert client.files.retrieve(found.id).status == "processed"


def test_follower_sees_every_line_once_while_chunks_land(server, engine):
    """A reader asking for what came after its last read, as often as it can, while records finish one by one:
    what it read, put together, is the final file byte for byte."""
    gate, total = "pr-follow", 24
    batch_id = create(server, [chat(f"f{i:02d}", f"follow {i} #hold={gate}") for i in range(total)])["id"]
    out_id = f"file-{batch_id}-output"
    pieces: list[bytes] = []
    problems: list[str] = []

    def follow() -> None:
        read = 0
        while True:
            ended = get(server, batch_id)["status"] in TERMINAL
            answer = _content(server, out_id, range=f"bytes={read}-")
            if answer.status_code == 206:
                pieces.append(answer.content)
                read += len(answer.content)
            elif answer.status_code != 416:
                problems.append(f"{answer.status_code}: {answer.text}")
                return
            if ended:
                return
            time.sleep(0.005)  # often, but leaving the two cores to the server

    reader = threading.Thread(target=follow)
    reader.start()
    for _ in range(total // 3):
        engine.wait_held(gate, 1)
        engine.release(gate, count=min(3, engine.held(gate)) or 1)
    engine.release(gate)
    reader.join(120)
    assert not reader.is_alive() and not problems
    final = _content(server, out_id).content
    assert b"".join(pieces) == final
    assert sorted(line["custom_id"] for line in _lines(final)) == [f"f{i:02d}" for i in range(total)]


def test_unknown_other_organizations_and_absent_result_files_are_404(server, engine):
    gate = "pr-404"
    batch_id = create(server, [chat("only", f"one #hold={gate}")])["id"]
    engine.wait_held(gate, 1)
    other = server.new_org_key()
    for file_id in (f"file-{batch_id}-output", f"file-{batch_id}-error"):
        assert _file(server, file_id, api_key=other).status_code == 404
        assert server.http("GET", f"/files/{file_id}/content", api_key=other).status_code == 404
        assert server.http("DELETE", f"/files/{file_id}").status_code == 404  # nothing to delete before the end
    assert _file(server, "file-batch_000000000000-output").status_code == 404
    listed = server.http("GET", "/files").json()["data"]
    assert f"file-{batch_id}-output" not in {f["id"] for f in listed}
    engine.release(gate)
    assert server.wait(batch_id)["status"] == "completed"
    # It ended without errors: no error file, the id answers 404 as before.
    assert _file(server, f"file-{batch_id}-error").status_code == 404
    assert _file(server, f"file-{batch_id}-output").json()["status"] == "processed"


def _orl_follow(server, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OPENRELAY_BASE_URL": server.base_url, "OPENRELAY_API_KEY": server.api_key}
    return subprocess.Popen([ORL, "batches", "results", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_cli_results_follow_prints_each_line_once_and_exits_at_the_end(server, engine):
    gate_ok, gate_bad = "pr-cli-ok", "pr-cli-bad"
    records = [chat(f"c{i}", f"cli {i} #hold={gate_ok}") for i in range(5)]
    records += [chat("cbad", f"no #hold={gate_bad} #status=422")]
    batch_id = create(server, records)["id"]
    engine.wait_held(gate_ok, 5)
    engine.release(gate_ok, count=2)
    _when_lines(server, f"file-{batch_id}-output", 2)

    now = server.orl("batches", "results", batch_id)  # no --follow: what is durable now, then exit
    assert now.returncode == 0, now.stderr
    assert sorted(line["custom_id"] for line in _lines(now.stdout.encode())) == sorted(
        line["custom_id"] for line in _lines(_content(server, f"file-{batch_id}-output").content))
    assert len(now.stdout.splitlines()) == 2 and "so far" in now.stderr

    follower = _orl_follow(server, batch_id, "--follow", "--interval", "0.05")
    assert follower.stdout is not None
    shown = [orjson.loads(follower.stdout.readline())["custom_id"] for _ in range(2)]  # what had landed
    engine.release(gate_ok, count=1)
    shown.append(orjson.loads(follower.stdout.readline())["custom_id"])  # printed as it lands
    assert follower.poll() is None  # still following: the batch runs on
    engine.release(gate_ok)
    engine.release(gate_bad)
    stdout, stderr = follower.communicate(timeout=120)
    assert follower.returncode == 0, stderr
    shown += [line["custom_id"] for line in _lines(stdout.encode())]
    assert sorted(shown) == sorted([f"c{i}" for i in range(5)] + ["cbad"])  # each once
    assert server.wait(batch_id)["status"] == "completed" and "completed" in stderr

    errors_only = server.orl("batches", "results", batch_id, "--kind", "error")
    assert [line["custom_id"] for line in _lines(errors_only.stdout.encode())] == ["cbad"]
    missing = server.orl("batches", "results", "batch_000000000000")
    assert missing.returncode == 4


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        return LocalBlobStore(tmp_path)
    bucket = request.getfixturevalue("s3_bucket")
    return S3BlobStore(S3Location(bucket=bucket.name, prefix="partial-" + secrets.token_hex(4)),
                       endpoint=bucket.server.endpoint, region=bucket.server.region,
                       access_key_id=bucket.server.access_key_id, secret_access_key=bucket.server.secret_access_key,
                       read_bytes=1 << 16)  # read windows smaller than a line: a chunk goes missing mid-read


def test_a_read_that_outlives_the_batch_finishes_from_the_composed_file(blob_store: Any):
    """The batch ends while a snapshot is read: its chunk blobs are gone, the rest comes from the composed file
    at the same offset (worker/finalize.py composes it before it deletes the chunks)."""
    blobs = blob_store
    lines = [orjson.dumps({"custom_id": f"r{i}", "pad": "x" * 70_000}) + b"\n" for i in range(3)]  # > a piece
    keys = [f"batches/batch_0123456789ab/chunks/{i:06d}.out.jsonl" for i in range(1, 4)]
    for key, line in zip(keys, lines, strict=True):
        with blobs.writer(key) as out:
            out.write(line)
    final_key = "batches/batch_0123456789ab/output.jsonl"
    with blobs.writer(final_key) as out:  # the composed file may hold more than the snapshot: only its prefix is read
        out.write(b"".join(lines) + b'{"custom_id": "later"}\n')
    snapshot = PartialFile(id="file-batch_0123456789ab-output", org_id="o", purpose="batch_output",
                           filename="x", bytes=sum(map(len, lines)), created_at=0, blob_key="",
                           segments=tuple((k, len(v)) for k, v in zip(keys, lines, strict=True)),
                           final_key=final_key, lines=3)
    reading = read_partial(blobs, snapshot)
    first = next(reading)
    assert 0 < len(first) < len(lines[0])
    for key in keys:
        blobs.delete(key)  # the batch finalized here
    assert first + b"".join(reading) == b"".join(lines)
    start = len(lines[0]) + 3  # in the middle of the second line
    assert b"".join(read_partial(blobs, snapshot, start=start)) == b"".join(lines)[start:]


@pytest.mark.parametrize(("file_id", "parsed"), [
    ("file-batch_0123456789ab-output", ("batch_0123456789ab", "output")),
    ("file-batch_0123456789ab-error", ("batch_0123456789ab", "error")),
    ("file-batch_0123456789ab-rejections", None),
    ("file-0123456789abcdef01234567", None),
    ("file-batch_0123456789AB-output", None),
])
def test_result_file_ids(file_id, parsed):
    found = parse_result_file_id(file_id)
    assert (found and (found.batch_id, found.kind)) == parsed or (found is None and parsed is None)


@pytest.mark.slow
def test_partial_files_on_s3(make_server, engine, s3_bucket):  # noqa: F811
    """The same promise with every blob in a bucket: chunks read back while the batch runs, then the composed
    file, which begins with what was read."""
    gate = "pr-s3"
    server = make_server(args=("--blob-url", s3_bucket.url("partial-serve-" + secrets.token_hex(4))),
                         env={**s3_bucket.server.env(), "OPENRELAY_FLUSH_RECORDS": "1"})
    batch_id = create(server, [chat(f"b{i}", f"bucket {i} #hold={gate}") for i in range(4)])["id"]
    out_id = f"file-{batch_id}-output"
    engine.wait_held(gate, 4)
    engine.release(gate, count=2)
    found = _when_lines(server, out_id, 2)
    early = _content(server, out_id).content
    assert len(early) == found["bytes"] and len(_lines(early)) == 2
    half = len(early) // 2
    assert _content(server, out_id, range=f"bytes={half}-").content == early[half:]
    engine.release(gate)
    assert server.wait(batch_id)["status"] == "completed"
    final = _content(server, out_id).content
    assert final.startswith(early) and len(_lines(final)) == 4
