"""A batch's result files before it ends: ``file-<batch id>-output`` and ``file-<batch id>-error`` read while it
runs, from the chunks its workers made durable so far, as a snapshot of the chunk rows. Every read is a prefix of
every later one and of the final file; why, and the partial file object: docs/results-while-running.md."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..blobs.base import BlobMissing, BlobStore
from ..blobs.keys import error_key, output_key
from ..errors import NotFound, no_such
from ..ids import parse_result_file_id
from ..runtime import Runtime
from ..store.db import Database
from ..store.result_segments import result_segments
from ..types import Batch, FileRecord

__all__ = ["PartialFile", "parse_result_file_id", "partial_file", "read_partial"]

_READ_SIZE = 1 << 16


@dataclass(frozen=True, kw_only=True)
class PartialFile(FileRecord):
    """A result file of a batch still running: ``segments`` are (chunk blob key, size) in file order, ``bytes``
    their sum; ``final_key`` is the blob the composed file will be (its bytes begin with these)."""

    segments: tuple[tuple[str, int], ...]
    final_key: str
    lines: int

    def as_api(self) -> dict[str, Any]:
        shown = super().as_api()
        shown["status"] = "partial"
        shown["openrelay"] = {"partial": True, "lines": self.lines}
        return shown


def partial_file(rt: Runtime, org_id: str, file_id: str) -> FileRecord:
    """The result file ``file_id`` as it stands: its row once the batch has ended, else a ``PartialFile``
    snapshot. 404 (as for any unknown file) when the id names no batch of the organization, or an ended batch
    without such a file."""
    wanted = parse_result_file_id(file_id)
    if wanted is None:
        raise no_such("File", file_id, param="file_id")
    try:
        return rt.files.get(org_id, file_id)
    except NotFound:
        pass
    try:
        batch = rt.batches.get(org_id, wanted.batch_id)
    except NotFound:
        raise no_such("File", file_id, param="file_id") from None
    if not batch.terminal:
        try:
            return _snapshot(rt.db, rt.blobs, batch, file_id, wanted.kind)
        except BlobMissing:
            pass  # it ended while its chunks were measured: they were composed, then deleted
    return rt.files.get(org_id, file_id)  # it ended after the first look: its row, if it has one, is there now


def _snapshot(db: Database, blobs: BlobStore, batch: Batch, file_id: str, kind: str) -> PartialFile:
    found = result_segments(db, batch.id, kind)
    segments = tuple((s.key, blobs.size(s.key) if s.size is None else s.size) for s in found)
    return PartialFile(id=file_id, org_id=batch.org_id, purpose="batch_output",
                       filename=f"{batch.id}_{kind}.jsonl", bytes=sum(size for _, size in segments),
                       created_at=batch.created_at, blob_key="", segments=segments,
                       final_key=output_key(batch.id) if kind == "output" else error_key(batch.id),
                       lines=sum(s.lines for s in found))


def read_partial(blobs: BlobStore, snapshot: PartialFile, start: int = 0) -> Iterator[bytes]:
    """The snapshot's bytes from offset ``start``, exactly ``snapshot.bytes - start`` of them, in pieces of about
    64 KiB however small its chunks are (each piece a response sends costs a hop to a thread)."""
    gathered = bytearray()
    for piece in _snapshot_pieces(blobs, snapshot, start):
        gathered += piece
        if len(gathered) >= _READ_SIZE:
            yield bytes(gathered)
            gathered.clear()
    if gathered:
        yield bytes(gathered)


def _snapshot_pieces(blobs: BlobStore, snapshot: PartialFile, start: int) -> Iterator[bytes]:
    at = start  # the file offset of the next byte to give
    position = 0  # the file offset where the current segment begins
    for key, size in snapshot.segments:
        if at >= position + size:
            position += size
            continue
        try:
            for piece in _read_range(blobs, key, at - position, position + size - at):
                yield piece
                at += len(piece)
        except BlobMissing:
            break  # the batch ended meanwhile: the composed file holds the same bytes at the same offsets
        position += size
    if at < snapshot.bytes:
        yield from _read_range(blobs, snapshot.final_key, at, snapshot.bytes - at)


def _read_range(blobs: BlobStore, key: str, offset: int, length: int) -> Iterator[bytes]:
    with blobs.open(key) as handle:
        if offset:
            handle.seek(offset)
        while length > 0:
            piece = handle.read(min(_READ_SIZE, length))
            if not piece:
                raise BlobMissing(f"blob {key!r} ended {length} bytes early")
            length -= len(piece)
            yield piece
