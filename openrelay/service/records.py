"""A batch's results as the dashboard browses them: pages of result lines, the errors grouped by code, and the
throughput over time, read from what is durable so far.

A terminal batch's lines are its result files; a live batch's are the chunks its workers made durable (what the
result files will be composed from) and its create rejections. Pages are read from a byte offset in one of these
blobs, so a page of a 50,000-record batch reads a page's worth of lines, not the files; a search or filter reads
on from the offset until it has a page, holding one page at most.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from ..blobs.base import BlobMissing, BlobStore
from ..blobs.keys import rejections_key
from ..errors import InvalidRequest, NotFound
from ..runtime import Runtime
from ..store.batches import Batches
from ..store.db import Database
from ..store.files import Files
from ..store.result_segments import result_segments
from ..store.results import Results
from ..types import ApiKey, Batch, Scope
from .auth import require
from .batches import get_batch

__all__ = ["ResultLine", "RecordPage", "browse_records", "error_summary", "throughput", "find_request",
           "create_rejections", "RECORD_KINDS"]

T = TypeVar("T")

RECORD_KINDS = ("all", "success", "error")
MAX_PAGE = 100


@dataclass(frozen=True, kw_only=True)
class ResultLine:
    custom_id: str
    ok: bool
    code: str | None  # the error's code; None on a success
    message: str | None
    line: dict[str, Any]  # the whole result line as stored (a create rejection: its rejections-file line)


@dataclass(frozen=True, kw_only=True)
class RecordPage:
    records: list[ResultLine]
    next_cursor: str | None  # where the next page starts; None: this was the last


def _sources(db: Database, files: Files, batch: Batch) -> list[tuple[str, str]]:
    """(kind, blob key) of every blob holding this batch's result lines now, in the order they are browsed."""
    if batch.terminal:
        found = []
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                try:
                    found.append(("result", files.get(batch.org_id, file_id).blob_key))
                except NotFound:
                    continue  # the owner deleted it
        return found
    # What the result files hold so far, as their partial reads see it (service/partial_results.py).
    found = [("result", s.key) for kind in ("output", "error") for s in result_segments(db, batch.id, kind)]
    if batch.rejected_count:
        found.append(("rejection", rejections_key(batch.id)))
    return found


def _result_line(kind: str, raw: bytes) -> ResultLine | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    custom_id = str(data.get("custom_id") or "")
    if kind == "rejection":
        return ResultLine(custom_id=custom_id, ok=False, code=data.get("code"),
                          message=f"line {data.get('line')}: {data.get('message')}", line=data)
    error = data.get("error")
    if isinstance(error, dict):
        return ResultLine(custom_id=custom_id, ok=False, code=error.get("code"), message=error.get("message"),
                          line=data)
    return ResultLine(custom_id=custom_id, ok=True, code=None, message=None, line=data)


def _lines_from(blobs: BlobStore, key: str, offset: int) -> Iterator[tuple[int, bytes]]:
    """(offset of the line, line) from ``offset`` on."""
    with blobs.open(key) as handle:
        handle.seek(offset)
        position = offset
        for raw in handle:
            yield position, raw
            position += len(raw)


def _parse_cursor(cursor: str | None) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    try:
        source, offset = (int(part) for part in cursor.split(":", 1))
    except ValueError:
        raise InvalidRequest("the page cursor is not one this page gave", param="at") from None
    if source < 0 or offset < 0:
        raise InvalidRequest("the page cursor is not one this page gave", param="at")
    return source, offset


def browse_records(rt: Runtime, key: ApiKey, batch_id: str, *, kind: str = "all", code: str | None = None,
                   custom_id: str | None = None, cursor: str | None = None, limit: int = 20) -> RecordPage:
    """One page of result lines; ``custom_id`` matches as a substring, ``code`` exactly (errors only)."""
    batch = get_batch(rt.batches, key, batch_id)
    require(key, Scope.FILES_READ)  # result lines are the result files' content
    if kind not in RECORD_KINDS:
        raise InvalidRequest(f"kind must be one of: {', '.join(RECORD_KINDS)}", param="kind")
    limit = max(1, min(limit, MAX_PAGE))
    start_source, start_offset = _parse_cursor(cursor)

    def page(sources: list[tuple[str, str]]) -> RecordPage:
        found: list[ResultLine] = []
        for index, (source_kind, blob_key) in enumerate(sources):
            if index < start_source:
                continue
            for position, raw in _lines_from(rt.blobs, blob_key, start_offset if index == start_source else 0):
                if not raw.strip():
                    continue
                record = _result_line(source_kind, raw)
                if record is None or not _keeps(record, kind, code, custom_id):
                    continue
                if len(found) == limit:
                    return RecordPage(records=found, next_cursor=f"{index}:{position}")
                found.append(record)
        return RecordPage(records=found, next_cursor=None)

    return _read_sources(rt, batch, page)


def _read_sources(rt: Runtime, batch: Batch, read: Callable[[list[tuple[str, str]]], T]) -> T:
    """``read`` of the batch's sources (``_sources``); when the batch ended while its chunks were read (they were
    composed into its result files, then deleted), ``read`` again of the ended batch's files."""
    try:
        return read(_sources(rt.db, rt.files, batch))
    except BlobMissing:
        if batch.terminal:
            raise
    return read(_sources(rt.db, rt.files, rt.batches.get(batch.org_id, batch.id)))


def _keeps(record: ResultLine, kind: str, code: str | None, custom_id: str | None) -> bool:
    if kind == "success" and not record.ok or kind == "error" and record.ok:
        return False
    if code and record.code != code:
        return False
    return not custom_id or custom_id in record.custom_id


def error_summary(rt: Runtime, key: ApiKey, batch: Batch) -> list[tuple[str, int]]:
    """(code, count) of every error line so far, create rejections and run-time errors together, most first."""
    require(key, Scope.BATCH_READ, Scope.FILES_READ)
    def count(sources: list[tuple[str, str]]) -> list[tuple[str, int]]:
        counts: Counter[str] = Counter()
        for source_kind, blob_key in sources:
            for _position, raw in _lines_from(rt.blobs, blob_key, 0):
                if b'"error":null' in raw or not raw.strip():
                    continue  # a success line (orjson writes no spaces), skipped without parsing it
                record = _result_line(source_kind, raw)
                if record is not None and not record.ok:
                    counts[record.code or "(no code)"] += 1
        return counts.most_common()

    return _read_sources(rt, batch, count)


def throughput(results: Results, key: ApiKey, batch: Batch, buckets: int = 24) -> list[dict[str, int]]:
    """Records and tokens settled per interval, from when each chunk became durable: at most ``buckets``
    intervals of equal length between the first and the last chunk."""
    require(key, Scope.BATCH_READ)
    chunks = results.chunk_times(batch.id)
    if not chunks:
        return []
    first, last = chunks[0][0], chunks[-1][0]
    width = max(1, -(-(last - first + 1) // buckets))
    series = [{"start": first + i * width, "records": 0, "tokens": 0}
              for i in range((last - first) // width + 1)]
    for created_at, records, tokens in chunks:
        bucket = series[(created_at - first) // width]
        bucket["records"] += records
        bucket["tokens"] += tokens
    return series


def find_request(batches: Batches, blobs: BlobStore, key: ApiKey, batch_id: str,
                 custom_id: str) -> dict[str, Any] | None:
    """The input record with this custom_id (the first one), read from the batch's input; None when absent."""
    batch = get_batch(batches, key, batch_id)
    require(key, Scope.FILES_READ)
    needle = orjson.dumps(custom_id)[1:-1]  # as the text is spelled inside a JSON string, most often
    with blobs.open(batch.input_blob_key) as handle:
        for raw in handle:
            if needle not in raw:
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("custom_id") == custom_id:
                return record
    return None


def create_rejections(rt: Runtime, key: ApiKey, batch: Batch, *, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` lines of the batch's rejections file (``{line, custom_id, code, message}``), as the
    create answered them; none when it rejected nothing or the file was deleted."""
    require(key, Scope.FILES_READ)
    if not batch.rejections_file_id:
        return []
    try:
        blob_key = rt.files.get(key.org_id, batch.rejections_file_id).blob_key
    except NotFound:
        return []
    found: list[dict[str, Any]] = []
    for _position, raw in _lines_from(rt.blobs, blob_key, 0):
        if len(found) == limit:
            break
        if raw.strip():
            found.append(orjson.loads(raw))
    return found
