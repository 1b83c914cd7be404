"""Retry an ended batch's failures in one call (``POST /v1/batches/{id}/retry``, ``orl batches retry ID``): a new
batch, made by the normal create, of the input lines of the records that ended in error. Which records:
docs/retry.md; how the create's body is derived and what memory holds: docs/design.md, "Retrying a batch's
failures"."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import orjson

from ..blobs.base import BlobMissing
from ..errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge
from ..runtime import Runtime
from ..types import TAGS_KEY, ApiKey, Batch, Scope
from ..validation.lines import numbered_lines
from ..worker.inputs import read_rejections
from .auth import require, require_budget
from .bodies import json_object, reject_unrecognized
from .create import create_batch

__all__ = ["retry_batch", "RETRY_FIELDS", "NO_LINE_CODE"]

RETRY_FIELDS = ("codes",)
NO_LINE_CODE = "batch_failed"  # the code of a record that ended without any line
RETRY_OF_KEY = "retry_of"
_MAX_CODES = 100


class _CustomId(msgspec.Struct):
    custom_id: str = ""


class _ErrorCode(msgspec.Struct):
    code: Any = None


class _ErrorLine(msgspec.Struct):
    custom_id: str = ""
    error: _ErrorCode | None = None


_decode_custom_id = msgspec.json.Decoder(_CustomId).decode
_decode_error_line = msgspec.json.Decoder(_ErrorLine).decode


def retry_batch(rt: Runtime, key: ApiKey, batch_id: str, raw: bytes, idempotency_key: str | None = None) -> bytes:
    """The create's 200 body for the new batch, plus ``retried_count`` (how many records it took)."""
    require(key, Scope.BATCH_READ, Scope.BATCH_WRITE, Scope.FILES_READ)  # reads the results, creates a batch
    require_budget(key)
    codes = _retry_codes(raw)
    source = rt.batches.get(key.org_id, batch_id)
    if not source.terminal:
        raise Conflict(f"batch {batch_id} is {source.status.value}; only an ended batch can be retried",
                       code="batch_not_ended")
    lines = _failed_lines(rt, source, codes)
    if not lines:
        which = f" with code {', '.join(codes)}" if codes else ""
        raise InvalidRequest(f"batch {batch_id} has no records that ended in error{which}; nothing to retry",
                             code="nothing_to_retry", param="codes" if codes else None)
    body = _create_body(source, lines)
    if len(body) > rt.settings.http.max_create_body_bytes:
        raise PayloadTooLarge(f"the retry's {len(lines)} records make a create of {len(body)} bytes, over the "
                              f"{rt.settings.http.max_create_body_bytes}-byte limit of inline creates",
                              code="request_too_large")
    answer = orjson.loads(create_batch(rt, key, body, idempotency_key))
    answer["retried_count"] = len(lines)
    return orjson.dumps(answer)


def _retry_codes(raw: bytes) -> list[str] | None:
    """The request's ``codes`` (sorted, each once), or None for every failure. An empty body is ``{}``."""
    if not raw.strip():
        return None
    body = json_object(raw)
    reject_unrecognized(body, RETRY_FIELDS)
    codes = body.get("codes")
    if codes is None:
        return None
    if (not isinstance(codes, list) or not codes or len(codes) > _MAX_CODES
            or not all(isinstance(c, str) and c for c in codes)):
        raise InvalidRequest(f"codes must be a list of 1 to {_MAX_CODES} non-empty strings (error codes)",
                             param="codes")
    return sorted(set(codes))


def _failed_lines(rt: Runtime, source: Batch, codes: list[str] | None) -> list[bytes]:
    """The input lines of the accepted records to retry, in input order."""
    rejected = {r.line for r in read_rejections(rt.blobs, source)}
    wanted = _chooser(rt, source, codes)
    taken: list[bytes] = []
    try:
        with rt.blobs.open(source.input_blob_key) as handle:
            for line, raw in numbered_lines(handle, rt.settings.batches.max_line_bytes):
                if line in rejected:
                    continue
                if wanted(_record_custom_id(raw)):
                    taken.append(raw.rstrip(b"\r"))
    except BlobMissing:
        raise Conflict(f"the input of batch {source.id} ({source.input_file_id}) was deleted; its records "
                       "cannot be read again", code="input_file_deleted") from None
    return taken


def _chooser(rt: Runtime, source: Batch, codes: list[str] | None) -> Callable[[str], bool]:
    """Whether the accepted record with this custom_id is retried."""
    if codes is None or NO_LINE_CODE in codes:
        succeeded = _custom_ids(rt, source, source.output_file_id, "output")
    if codes is None:
        return lambda custom_id: custom_id not in succeeded
    code_of = _error_codes(rt, source)
    chosen = frozenset(codes)
    if NO_LINE_CODE in chosen:  # a record without an error line is batch_failed only when it has no line at all
        return lambda custom_id: custom_id not in succeeded and code_of.get(custom_id, NO_LINE_CODE) in chosen
    return lambda custom_id: code_of.get(custom_id) in chosen


def _record_custom_id(raw: bytes) -> str:
    try:
        return _decode_custom_id(raw).custom_id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        # The create accepted it, so orjson reads it (it reads a little deeper than msgspec).
        record = orjson.loads(raw)
        return str(record.get("custom_id") or "") if isinstance(record, dict) else ""


def _result_lines(rt: Runtime, source: Batch, file_id: str | None, kind: str) -> Iterator[bytes]:
    if not file_id:
        return
    try:
        blob_key = rt.files.get(source.org_id, file_id).blob_key
        with rt.blobs.open(blob_key) as handle:
            for raw in handle:
                if raw.strip():
                    yield raw
    except (NotFound, BlobMissing):
        raise Conflict(f"the {kind} file of batch {source.id} ({file_id}) was deleted; which records failed "
                       "cannot be told", code="result_file_deleted") from None


def _custom_ids(rt: Runtime, source: Batch, file_id: str | None, kind: str) -> set[str]:
    return {_decode_custom_id(raw).custom_id for raw in _result_lines(rt, source, file_id, kind)}


def _error_codes(rt: Runtime, source: Batch) -> dict[str, str]:
    """custom_id -> code of each error line. The create's rejections are in the error file too, after the
    run-time lines; they never share a custom_id with an accepted record (a shared one is a duplicate, and every
    duplicate is rejected), and only accepted records are looked up."""
    found: dict[str, str] = {}
    for raw in _result_lines(rt, source, source.error_file_id, "error"):
        line = _decode_error_line(raw)
        if line.error is not None and isinstance(line.error.code, str):
            found.setdefault(line.custom_id, line.error.code)
    return found


def _create_body(source: Batch, lines: list[bytes]) -> bytes:
    """The create's body: the fields as JSON, then ``requests`` as the records' own bytes."""
    metadata = {RETRY_OF_KEY: source.id}
    tags = (source.metadata or {}).get(TAGS_KEY)
    if tags:
        metadata[TAGS_KEY] = tags
    fields = orjson.dumps({"endpoint": source.endpoint, "completion_window": source.completion_window,
                           "priority": source.priority, "metadata": metadata,
                           **({"failure_threshold": source.failure_threshold} if source.failure_threshold else {})})
    return fields[:-1] + b',"requests":[' + b",".join(lines) + b"]}"
