"""The BlobStore contract, one suite run against both stores: the local directory and S3 (a real SeaweedFS).

Parts are 5 MiB here (S3's smallest), so a blob of 12 MiB is a real multipart upload of three parts.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest

from openrelay.blobs import keys
from openrelay.blobs.base import BlobMissing, BlobStore, iter_bytes
from openrelay.blobs.local import LocalBlobStore
from openrelay.blobs.s3 import S3BlobStore, S3Location
from openrelay.config import Settings
from openrelay.errors import ConfigError, StoreError
from openrelay.runtime import check_blob_url, open_blob_store
from tests.support.seaweed import S3Bucket, s3_bucket, seaweed  # noqa: F401  (session fixtures)

PART = 5 << 20
BIG = 12 << 20  # three parts: two whole, one short


class Backend:
    """A fresh, empty store of one kind, and what only a look past the interface can tell."""

    def __init__(self, kind: str, tmp_path: Path, bucket: S3Bucket | None) -> None:
        self.kind = kind
        if kind == "local":
            self.root = tmp_path / "blobs"
            self.blobs: Any = LocalBlobStore(self.root)
        else:
            assert bucket is not None
            self.bucket = bucket
            self.prefix = "contract-" + secrets.token_hex(4)
            self.blobs = S3BlobStore(S3Location(bucket=bucket.name, prefix=self.prefix),
                                     endpoint=bucket.server.endpoint, region=bucket.server.region,
                                     access_key_id=bucket.server.access_key_id,
                                     secret_access_key=bucket.server.secret_access_key,
                                     part_bytes=PART, read_bytes=1 << 20)

    def stored(self) -> list[str]:
        """Every key that holds bytes, as the medium itself lists them (files, or objects under the prefix)."""
        if self.kind == "local":
            return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        return [k.removeprefix(self.prefix + "/") for k in self.bucket.keys(self.prefix + "/")]

    def unfinished_uploads(self) -> list[str]:
        if self.kind == "local":
            return [k for k in self.stored() if k.rsplit("/", 1)[-1].startswith(".tmp-")]
        return [u for u in self.bucket.server.uploads_in_progress(self.bucket.name) if u.startswith(self.prefix + "/")]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    bucket = request.getfixturevalue("s3_bucket") if request.param == "s3" else None
    yield Backend(request.param, tmp_path, bucket)


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` bytes of distinct JSON-ish lines (so a wrong offset or order shows)."""
    lines, total, n = [], 0, 0
    while total < size:
        line = b'{"n": %d, "seed": %d, "pad": "%s"}\n' % (n, seed, b"x" * (n % 97))
        lines.append(line)
        total += len(line)
        n += 1
    return b"".join(lines)[:size]


def write(blobs: BlobStore, key: str, data: bytes, piece: int = 65_536) -> None:
    with blobs.writer(key) as out:
        for start in range(0, len(data), piece):
            out.write(data[start:start + piece])


def read(blobs: BlobStore, key: str) -> bytes:
    return b"".join(iter_bytes(blobs, key))


@pytest.mark.parametrize("size", [0, 10, BIG], ids=["empty", "small", "multipart"])
def test_a_blob_reads_back_whole(backend: Backend, size: int) -> None:
    data = payload(size)
    key = keys.file_key("file-" + str(size))
    write(backend.blobs, key, data)
    assert backend.blobs.exists(key)
    assert backend.blobs.size(key) == size
    assert read(backend.blobs, key) == data
    with backend.blobs.open(key) as handle:
        assert b"".join(handle) == data  # iterating yields lines
    with backend.blobs.open(key) as handle:
        assert [line for line in handle] == data.splitlines(keepends=True)
    assert backend.stored() == [key]


def test_open_seeks_to_an_offset(backend: Backend) -> None:
    """The record browser pages by byte offset: seek, then read lines from there (across read windows)."""
    data = payload(3 << 20)
    write(backend.blobs, "batches/b1/output.jsonl", data)
    offset = data.index(b"\n", 2_500_000) + 1
    with backend.blobs.open("batches/b1/output.jsonl") as handle:
        handle.seek(offset)
        assert handle.readline() == data[offset:data.index(b"\n", offset) + 1]
        handle.seek(10)
        assert handle.read(20) == data[10:30]


def test_read_ranges_returns_each_range_in_the_order_asked(backend: Backend) -> None:
    """A worker reads a batch's records in dispatch order (``read_ranges``), not in the file's order."""
    data = payload(3 << 20)
    key = keys.file_key("file-ranges")
    write(backend.blobs, key, data)
    ranges = [(2_900_000, 77), (0, 10), (1_000_000, 65_536), (5, 0), (len(data) - 3, 3), (0, 10)]
    assert backend.blobs.read_ranges(key, ranges) == [data[s:s + n] for s, n in ranges]
    assert backend.blobs.read_ranges(key, []) == []
    with pytest.raises(BlobMissing):
        backend.blobs.read_ranges(keys.file_key("file-none"), [(0, 1)])


@pytest.mark.parametrize("size", [10, BIG], ids=["small", "multipart"])
def test_a_failed_writer_leaves_nothing(backend: Backend, size: int) -> None:
    key = keys.chunk_key("b1", 1, "out", "run")
    with pytest.raises(RuntimeError), backend.blobs.writer(key) as out:
        out.write(payload(size))
        raise RuntimeError("the writer's caller failed midway")
    assert not backend.blobs.exists(key)
    assert backend.stored() == []
    assert backend.unfinished_uploads() == []


def test_a_failed_rewrite_keeps_the_old_blob(backend: Backend) -> None:
    key = keys.output_key("b1")
    write(backend.blobs, key, b"old\n")
    with pytest.raises(RuntimeError), backend.blobs.writer(key) as out:
        out.write(payload(BIG, seed=1))
        raise RuntimeError("finalize crashed while composing")
    assert read(backend.blobs, key) == b"old\n"
    assert backend.unfinished_uploads() == []


def test_a_blob_is_invisible_until_its_writer_exits(backend: Backend) -> None:
    """Bytes leave the process while the writer runs (S3: parts of a multipart upload already stored) and the
    blob still cannot be seen: it appears whole when the writer exits."""
    key = keys.file_key("file-big")
    data = payload(BIG)
    with backend.blobs.writer(key) as out:
        out.write(data[:PART * 2 + 1])
        assert not backend.blobs.exists(key)
        if backend.kind == "s3":
            assert len(backend.unfinished_uploads()) == 1  # a multipart upload under way
        out.write(data[PART * 2 + 1:])
        assert not backend.blobs.exists(key)
    assert read(backend.blobs, key) == data
    assert backend.unfinished_uploads() == []


def test_missing_keys(backend: Backend) -> None:
    key = keys.file_key("file-none")
    assert not backend.blobs.exists(key)
    with pytest.raises(BlobMissing), backend.blobs.open(key):
        pass
    with pytest.raises(BlobMissing):
        backend.blobs.size(key)
    with pytest.raises(BlobMissing):
        read(backend.blobs, key)
    backend.blobs.delete(key)  # absent keys are fine


def test_compose_concatenates_chunks_in_order(backend: Backend) -> None:
    sources = {keys.chunk_key("b1", 0, "out", "run"): payload(PART + 123, seed=0),  # more than a part
               keys.chunk_key("b1", 1, "out", "run"): b"",
               keys.chunk_key("b1", 2, "out", "run"): payload(1000, seed=2),
               keys.chunk_key("b1", 3, "out", "run"): payload(PART * 2, seed=3)}
    for key, data in sources.items():
        write(backend.blobs, key, data)
    size = backend.blobs.compose(keys.output_key("b1"), list(sources))
    expected = b"".join(sources.values())
    assert size == len(expected) == backend.blobs.size(keys.output_key("b1"))
    assert read(backend.blobs, keys.output_key("b1")) == expected
    assert backend.blobs.compose(keys.error_key("b1"), []) == 0
    assert read(backend.blobs, keys.error_key("b1")) == b""
    assert backend.unfinished_uploads() == []


def test_compose_with_a_missing_source_writes_nothing(backend: Backend) -> None:
    write(backend.blobs, keys.chunk_key("b1", 0, "out", "run"), payload(PART + 1))
    with pytest.raises(BlobMissing):
        backend.blobs.compose(keys.output_key("b1"), [keys.chunk_key("b1", 0, "out", "run"),
                                                      keys.chunk_key("b1", 1, "out", "run")])
    assert backend.stored() == [keys.chunk_key("b1", 0, "out", "run")]
    assert backend.unfinished_uploads() == []


def test_delete_removes_every_byte_of_a_blob(backend: Backend) -> None:
    write(backend.blobs, keys.file_key("file-a"), payload(BIG))
    write(backend.blobs, keys.file_key("file-b"), b"kept\n")
    backend.blobs.delete(keys.file_key("file-a"))
    assert not backend.blobs.exists(keys.file_key("file-a"))
    assert backend.stored() == [keys.file_key("file-b")]
    backend.blobs.delete(keys.file_key("file-a"))


def test_delete_folder_removes_every_blob_under_it_and_nothing_beside(backend: Backend) -> None:
    folder = keys.chunks_folder("b1")
    under = [keys.chunk_key("b1", seq, kind, run) for seq in (1, 2) for kind in ("out", "err") for run in ("r1", "r2")]
    beside = [keys.output_key("b1"), keys.chunk_key("b10", 1, "out", "r1"), keys.file_key("b1")]
    for key in under + beside:
        write(backend.blobs, key, b"line\n")
    write(backend.blobs, keys.chunk_key("b1", 3, "out", "r1"), payload(BIG))  # a multipart object, whole
    if backend.kind == "local":  # a write a killed process left unfinished under the folder
        (backend.root / folder / ".tmp-abandoned").write_bytes(b"half")
    backend.blobs.delete_folder(folder)
    assert backend.stored() == sorted(beside)
    backend.blobs.delete_folder(folder)  # gone already: fine
    backend.blobs.delete_folder(keys.chunks_folder("never"))


def test_the_layout_is_the_keys(backend: Backend) -> None:
    """Both stores keep every key at the same place under their root (the local directory or the prefix)."""
    written = [keys.file_key("file-1"), keys.rejections_key("b1"), keys.chunk_key("b1", 7, "err", "a1b2"),
               keys.error_tail_key("b1"), keys.output_key("b1"), keys.error_key("b1")]
    for key in written:
        write(backend.blobs, key, b"x\n")
    assert backend.stored() == sorted(written)
    assert keys.chunk_key("b1", 7, "err", "a1b2") == "batches/b1/chunks/000007.a1b2.err.jsonl"
    assert keys.file_key("file-1") == "files/file-1"


@pytest.mark.parametrize("key", ["/etc/passwd", "../x", "files/../../x", "files//x", ""])
def test_bad_keys_are_refused(backend: Backend, key: str) -> None:
    with pytest.raises(StoreError):
        backend.blobs.exists(key) if backend.kind == "s3" else backend.blobs.size(key)
    with pytest.raises(StoreError), backend.blobs.writer(key) as out:
        out.write(b"x")


def test_a_store_that_is_away_raises_store_error(backend: Backend, tmp_path: Path) -> None:
    """Driver errors (OS errors, obstore's) are StoreError at the boundary, never the driver's own type."""
    if backend.kind == "local":
        blocked = tmp_path / "blocked"
        blobs: Any = LocalBlobStore(blocked)
        os.rmdir(blocked)
        blocked.write_bytes(b"")  # the root is now a file: every write and read fails in the OS
    else:
        from tests.support.server import free_port

        blobs = S3BlobStore(S3Location(bucket="nowhere", prefix=""), endpoint=f"http://127.0.0.1:{free_port()}",
                            access_key_id="k", secret_access_key="s")
    with pytest.raises(StoreError) as failure, blobs.writer(keys.file_key("f")) as out:
        out.write(b"x\n")
    assert not isinstance(failure.value, BlobMissing)
    with pytest.raises(StoreError):
        read(blobs, keys.file_key("f"))


# -- choosing the store: runtime.open_blob_store --------------------------------------------------------------

def test_the_default_stays_the_data_dir(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path, database_url=None)
    blobs = open_blob_store(settings, environ={})
    assert isinstance(blobs, LocalBlobStore) and blobs.root == tmp_path / "blobs"


@pytest.mark.slow
def test_an_s3_url_with_the_aws_variables(s3_bucket: S3Bucket, tmp_path: Path) -> None:  # noqa: F811
    prefix = "runtime-" + secrets.token_hex(4)
    settings = Settings.build(data_dir=tmp_path, database_url=None, blob_url=s3_bucket.url(prefix))
    blobs = open_blob_store(settings, environ=s3_bucket.server.env())
    assert isinstance(blobs, S3BlobStore)
    write(blobs, keys.file_key("f"), b"hello\n")
    assert s3_bucket.keys(prefix + "/") == [f"{prefix}/files/f"]
    raw = obstore.get(s3_bucket.server.store(s3_bucket.name), f"{prefix}/files/f").bytes()
    assert bytes(raw) == b"hello\n"
    assert not (tmp_path / "blobs").exists()


@pytest.mark.slow
def test_an_unreachable_bucket_stops_the_start(s3_bucket: S3Bucket, tmp_path: Path) -> None:  # noqa: F811
    env = s3_bucket.server.env()
    missing = Settings.build(data_dir=tmp_path, database_url=None, blob_url="s3://no-such-bucket-here/x")
    with pytest.raises(ConfigError, match="cannot be listed"):
        open_blob_store(missing, environ=env)
    refused = Settings.build(data_dir=tmp_path, database_url=None, blob_url=s3_bucket.url("x"))
    with pytest.raises(ConfigError, match="cannot be listed"):
        open_blob_store(refused, environ={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://bucket/a/../b", "ftp://host/x", "s3://b/x?y=1"])
def test_bad_blob_urls_are_refused_before_anything_is_reached(url: str) -> None:
    with pytest.raises(ConfigError):
        check_blob_url(url)


def test_a_directory_url(tmp_path: Path) -> None:
    settings = Settings.build(data_dir=tmp_path / "data", database_url=None, blob_url=str(tmp_path / "elsewhere"))
    blobs = open_blob_store(settings, environ={})
    assert isinstance(blobs, LocalBlobStore) and blobs.root == tmp_path / "elsewhere"


_STREAM_SCRIPT = """
import resource, sys
from openrelay.blobs.base import iter_bytes
from openrelay.blobs.s3 import S3BlobStore, S3Location
bucket, prefix, endpoint, key_id, secret, size = sys.argv[1:]
blobs = S3BlobStore(S3Location(bucket=bucket, prefix=prefix), endpoint=endpoint, access_key_id=key_id,
                    secret_access_key=secret)
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
base = peak()  # the interpreter, obstore and its runtime
piece = b"y" * 65536
with blobs.writer("files/big") as out:
    for _ in range(int(size) // len(piece)):
        out.write(piece)
written = peak()
assert sum(len(chunk) for chunk in iter_bytes(blobs, "files/big", chunk_size=1 << 20)) == int(size)
assert blobs.compose("batches/b/output.jsonl", ["files/big"]) == int(size)
print(base, written, peak())
"""


@pytest.mark.slow
def test_a_large_blob_streams_through_bounded_memory(s3_bucket: S3Bucket) -> None:  # noqa: F811
    """256 MiB written, read back and composed by an S3 store in a fresh process: its peak memory grows by the
    parts and windows in flight (8 MiB parts, 4 at a time, one 8 MiB read window), far less than the blob."""
    import subprocess
    import sys

    size = 256 << 20
    prefix = "stream-" + secrets.token_hex(4)
    server = s3_bucket.server
    done = subprocess.run([sys.executable, "-c", _STREAM_SCRIPT, s3_bucket.name, prefix, server.endpoint,
                           server.access_key_id, server.secret_access_key, str(size)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    base, written, peak = (int(n) // 1024 for n in done.stdout.split())
    print(f"peak RSS in MiB: {base} at start, {written} after the write, {peak} after read and compose")
    assert written - base < 96 and peak - base < 96
    assert s3_bucket.keys(prefix + "/") == [f"{prefix}/batches/b/output.jsonl", f"{prefix}/files/big"]
    obstore.delete(server.store(s3_bucket.name), [f"{prefix}/batches/b/output.jsonl", f"{prefix}/files/big"])
