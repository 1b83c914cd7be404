"""Anthropic's Message Batches (``/v1/messages/batches``) on OpenRelay batches of the ``/v1/messages`` endpoint: a
create becomes an ordinary inline create, and the batch and its result lines are shown in Anthropic's shapes at read
time (docs/design.md, "Anthropic's Message Batches"; docs/api-contract.md §14)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson

from ..blobs.base import iter_bytes
from ..catalog import MESSAGES
from ..errors import Conflict, InvalidRequest, anthropic_error, no_such
from ..lifecycle import End
from ..runtime import Runtime
from ..types import TERMINAL, ApiKey, Batch, BatchStatus, Scope
from .auth import require
from .create import create_batch
from .create_body import decode_fields

__all__ = ["create_message_batch", "get_message_batch", "list_message_batches", "cancel_message_batch",
           "delete_message_batch", "message_batch_results", "result_line"]

_decode_object = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_REQUEST_FIELDS = ("custom_id", "params")
_UNRUN_RESULTS = {End.CANCELLED.unrun_code: "canceled", End.EXPIRED.unrun_code: "expired"}
_SERVER_CODES = (End.FAILED.unrun_code, End.ABORTED.unrun_code)  # unrun for a reason of the service's: ``api_error``
_REJECTED_LINE = re.compile(r"^line (\d+): ")


def create_message_batch(rt: Runtime, key: ApiKey, raw: bytes, idempotency_key: str | None,
                         base_url: str) -> dict[str, Any]:
    """The message batch a create makes; ``base_url`` (``http://host:port``) prefixes its ``results_url``."""
    answer = create_batch(rt, key, _openai_create(raw), idempotency_key, keep_all_rejected=True)
    made = orjson.loads(answer)
    made["unrun"] = 0
    return _message_batch(made, base_url)


def _openai_create(raw: bytes) -> bytes:
    """The inline create of ``POST /v1/batches`` that a message batch create stands for, as bytes. Each request's
    ``custom_id`` and ``params`` keep their bytes: the create judges them as it judges any record."""
    fields = decode_fields(raw)
    for name in fields:
        if name != "requests":
            raise InvalidRequest(f"{name}: Extra inputs are not permitted", param=name)
    try:
        requests = _decode_list(fields["requests"]) if "requests" in fields else []
    except (msgspec.DecodeError, RecursionError):
        requests = []
    if not requests:
        raise InvalidRequest("requests: a non-empty list of {custom_id, params} is required", param="requests")
    records = b",".join(_record(i, request) for i, request in enumerate(requests))
    return b'{"endpoint":"%s","completion_window":"24h","requests":[%s]}' % (MESSAGES.encode(), records)


def _record(index: int, request: msgspec.Raw) -> bytes:
    try:
        parts = _decode_object(request)
    except (msgspec.DecodeError, RecursionError):
        return bytes(request)  # not an object: the create rejects it (invalid_json), as a line of a file
    for name in parts:
        if name not in _REQUEST_FIELDS:
            raise InvalidRequest(f"requests.{index}.{name}: Extra inputs are not permitted",
                                 param=f"requests.{index}.{name}")
    fields = [b'"method":"POST","url":"%s"' % MESSAGES.encode()]
    if "custom_id" in parts:
        fields.append(b'"custom_id":' + bytes(parts["custom_id"]))
    if "params" in parts:
        fields.append(b'"body":' + bytes(parts["params"]))
    return b"{" + b",".join(fields) + b"}"


def get_message_batch(rt: Runtime, key: ApiKey, batch_id: str, base_url: str) -> dict[str, Any]:
    require(key, Scope.BATCH_READ)
    return _message_batch(_of(_read(rt, key, batch_id)), base_url)


def _read(rt: Runtime, key: ApiKey, batch_id: str) -> Batch:
    """The organization's message batch ``batch_id``; a batch of another endpoint is not one (404)."""
    batch = rt.batches.get(key.org_id, batch_id)
    if batch.endpoint != MESSAGES:
        raise no_such("Batch", batch_id, param="batch_id")
    return batch


def list_message_batches(rt: Runtime, key: ApiKey, *, limit: int, before_id: str | None, after_id: str | None,
                         base_url: str) -> dict[str, Any]:
    """A page of the organization's message batches, newest first, Anthropic's list object."""
    require(key, Scope.BATCH_READ)
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit: must be between 1 and 1000", param="limit")
    if before_id is not None and after_id is not None:
        raise InvalidRequest("give before_id or after_id, not both", param="before_id")
    found, more = rt.batches.list_of_endpoint(key.org_id, MESSAGES, limit=limit, after=after_id, before=before_id)
    data = [_message_batch(_of(batch), base_url) for batch in found]
    return {"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def cancel_message_batch(rt: Runtime, key: ApiKey, batch_id: str, base_url: str) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    _read(rt, key, batch_id)
    return _message_batch(_of(rt.batches.request_cancel(key.org_id, batch_id)), base_url)


def delete_message_batch(rt: Runtime, key: ApiKey, batch_id: str) -> dict[str, Any]:
    """Delete an ended message batch with its result files and requests (rows now, bytes by the next sweep of a
    worker's sweeper, ``worker/sweeper.py``); one still processing is 409."""
    require(key, Scope.BATCH_WRITE)
    batch = _read(rt, key, batch_id)
    if not batch.terminal or not rt.retention.delete_ended_batch(key.org_id, batch_id):
        raise Conflict(f"Batch {batch_id} is still processing: cancel it, and delete it once it has ended.",
                       code="batch_not_ended")
    return {"id": batch_id, "type": "message_batch_deleted"}


def message_batch_results(rt: Runtime, key: ApiKey, batch_id: str) -> Iterator[bytes]:
    """The results of an ended message batch, JSONL, one ``result_line`` per record: its output file's lines,
    then its error file's."""
    require(key, Scope.BATCH_READ, Scope.FILES_READ)
    batch = _read(rt, key, batch_id)
    if not batch.terminal:
        raise Conflict(f"Batch {batch_id} has not ended: its results_url is set once it has.",
                       code="batch_not_ended")
    blob_keys = [rt.files.get(key.org_id, file_id).blob_key
                 for file_id in (batch.output_file_id, batch.error_file_id) if file_id]
    for blob_key in blob_keys:
        rt.blobs.size(blob_key)  # a missing blob fails here, before the answer has started
    return _results(rt, blob_keys)


def _results(rt: Runtime, blob_keys: list[str]) -> Iterator[bytes]:
    for blob_key in blob_keys:
        rest = b""
        for chunk in iter_bytes(rt.blobs, blob_key):
            *lines, rest = (rest + chunk).split(b"\n")
            yield b"".join(orjson.dumps(result_line(orjson.loads(line))) + b"\n" for line in lines if line)
        if rest.strip():
            yield orjson.dumps(result_line(orjson.loads(rest))) + b"\n"


def result_line(line: dict[str, Any]) -> dict[str, Any]:
    """A line of a batch's result files (docs/api-contract.md §12) as Anthropic's result of that request."""
    custom_id = line.get("custom_id", "")
    response = line.get("response")
    if isinstance(response, dict):
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": response.get("body")}}
    error = line.get("error") or {}
    code, message = error.get("code"), str(error.get("message") or error.get("code"))
    if code in _UNRUN_RESULTS:
        return {"custom_id": custom_id, "result": {"type": _UNRUN_RESULTS[code]}}
    status = error.get("status_code")
    if status is None and code in _SERVER_CODES:
        status = 500
    elif status is None:  # rejected by the create: named as the request and its params, not a line and body
        message = re.sub(r"\bbody\b", "params", _REJECTED_LINE.sub(
            lambda m: f"requests.{int(m.group(1)) - 1}: ", message))
    return {"custom_id": custom_id, "result": {"type": "errored", "error": anthropic_error(status, message)}}


def _of(batch: Batch) -> dict[str, Any]:
    """What ``_message_batch`` reads of a batch: its API object and its unrun records."""
    return {**batch.as_api(), "unrun": batch.unrun}


def _message_batch(batch: dict[str, Any], base_url: str) -> dict[str, Any]:
    """A batch (its API object, with ``unrun``) as Anthropic's ``message_batch`` object. Its counts move as its
    records settle (Anthropic's stay at ``processing`` until the end); once it has ended, the records it never
    started are ``canceled`` or ``expired`` (by how it ended), every other failure ``errored``."""
    status = BatchStatus(batch["status"])
    counts = batch["request_counts"]
    ended = status in TERMINAL
    unrun = batch["unrun"] if status in (BatchStatus.CANCELLED, BatchStatus.EXPIRED) else 0
    tallies = {"processing": counts["total"] - counts["completed"] - counts["failed"],
               "succeeded": counts["completed"], "errored": counts["failed"] - unrun, "canceled": 0, "expired": 0}
    if unrun:
        tallies["canceled" if status is BatchStatus.CANCELLED else "expired"] = unrun
    processing = ("ended" if ended else "canceling" if status is BatchStatus.CANCELLING else "in_progress")
    return {
        "id": batch["id"], "type": "message_batch", "processing_status": processing, "request_counts": tallies,
        "ended_at": _rfc3339(batch[f"{status.value}_at"] if ended else None),
        "created_at": _rfc3339(batch["created_at"]), "expires_at": _rfc3339(batch["expires_at"]),
        "archived_at": None, "cancel_initiated_at": _rfc3339(batch["cancelling_at"]),
        "results_url": f"{base_url}/v1/messages/batches/{batch['id']}/results" if ended else None,
    }


def _rfc3339(seconds: int | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
