"""Batches: create (CONTRACT section 3, in its order), read, list, cancel, metadata."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec
import orjson

from ..blobs.keys import dispatch_order_key, file_key, refused_create_key, rejections_key
from ..catalog import ENDPOINTS, Catalog
from ..errors import Conflict, InvalidRequest, NoValidRecords, StoreError
from ..ids import new_batch_id, new_file_id, now, now_ns
from ..prefix import PROMPT_FIELDS
from ..runtime import Runtime
from ..store.compiled import Plan, run_plan
from ..store.idempotency import Claim, Stored
from ..types import ApiKey, Batch, BatchStatus, Priority, Rejection, Scope, unknown_progress
from ..validation.lines import BOM
from ..validation.scan import ScanResult, file_lines, inline_lines, scan_records
from .auth import require, require_budget
from .bodies import json_object, unrecognized_argument
from .estimate import dry_run_answer
from .pages import list_page

__all__ = ["create_batch", "get_batch", "get_batch_plan", "list_batches_plan", "cancel_batch", "replace_metadata",
           "check_metadata"]

WINDOWS = ("24h",)
MAX_IDEMPOTENCY_KEY_BYTES = 512
# The top-level fields of a create; any other is refused by name (OpenAI's "Unrecognized request argument").
CREATE_FIELDS = ("input_file_id", "requests", "endpoint", "completion_window", "metadata", "priority", "dry_run")
# Fields the OpenAI API documents that OpenRelay does not honor: refused with the reason, never ignored.
UNSUPPORTED_FIELDS = {
    "output_expires_after": "output_expires_after is not supported: result files are kept until they are deleted",
}


def create_batch(rt: Runtime, key: ApiKey, raw: bytes, idempotency_key: str | None = None) -> bytes:
    """The create's 200 body, as bytes: under an Idempotency-Key they are stored and replayed exactly.

    ``idempotency_key`` is the header as HTTP delivers it, decoded as latin-1 (one character per byte).
    Steps 1 to 3 of CONTRACT section 3 are here, the rest in ``_create``.
    """
    try:
        body, bad_body = _create_fields(raw), None
    except InvalidRequest as exc:
        # Section 3 puts 403, 402 and idempotency before anything of the request: a malformed body comes after.
        body, bad_body = {}, exc
    require(key, Scope.BATCH_WRITE, *((Scope.FILES_READ,) if "input_file_id" in body else ()))
    require_budget(key)
    claim = None
    if idempotency_key is not None and body.get("dry_run") is not True:  # a dry run claims no key
        found = rt.idempotency.claim(key.org_id, _check_idempotency_key(idempotency_key),
                                     hashlib.sha256(raw).hexdigest())
        if isinstance(found, Stored):
            return found.answer
        claim = found
    try:
        if bad_body is not None:
            raise bad_body
        return _create(rt, key, body, claim)
    except BaseException:
        if claim is not None:
            # Only a 200 is kept. A claim we cannot delete now goes stale and is taken over by a later retry.
            with contextlib.suppress(StoreError):
                rt.idempotency.release(claim)
        raise


def _check_idempotency_key(value: str) -> str:
    if not 1 <= len(value) <= MAX_IDEMPOTENCY_KEY_BYTES:
        raise InvalidRequest(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes; got {len(value)}",
                             param="Idempotency-Key")
    return value


def _create(rt: Runtime, key: ApiKey, body: dict[str, Any], claim: Claim | None) -> bytes:
    """Steps 4 to 8 of CONTRACT section 3."""
    priority = body.get("priority", Priority.STANDARD.value)
    if priority == Priority.EXPEDITED.value and not rt.accounts.org(key.org_id).expedited_enabled:
        raise Conflict('priority "expedited" is not enabled for this organization', code="feature_disabled")
    endpoint, metadata = _check_fields(body, priority)
    batch_id = new_batch_id()
    new_files: list[dict[str, Any]] = []
    if "input_file_id" in body:
        input_file = rt.files.get(key.org_id, body["input_file_id"])
        if input_file.purpose != "batch":
            raise InvalidRequest(f"file {input_file.id} has purpose {input_file.purpose!r}, not 'batch'",
                                 param="input_file_id")
        input_file_id, blob_key = input_file.id, input_file.blob_key

        def blocks() -> Iterator[Any]:
            with rt.blobs.open(blob_key) as handle:
                yield from file_lines(handle, rt.settings.max_line_bytes)

        source: Callable[[], Iterable[Any]] = blocks
    else:
        requests: list[msgspec.Raw] = body["requests"]
        source = functools.partial(inline_lines, requests)
        input_file_id, blob_key = new_file_id(), ""
    dry_run = body.get("dry_run") is True
    result = scan_records(source, endpoint=endpoint, catalog=rt.catalog, max_records=rt.settings.max_records,
                          collect_prefixes=dry_run or _may_group(rt.catalog, endpoint))
    if result.accepted == 0:
        _refuse_no_valid_records(rt, key, result, store=not dry_run)
    if dry_run:  # every check done: answer as the create would, making and storing nothing (service/estimate.py)
        return dry_run_answer(rt, key, result=result, source=source, endpoint=endpoint, priority=priority,
                              metadata=metadata, input_file_id=None if blob_key == "" else input_file_id)
    if not blob_key:
        blob_key = file_key(input_file_id)
        size = _store_inline(rt, blob_key, body["requests"])
        new_files.append(_file_values(input_file_id, key, "batch", f"{batch_id}_requests.jsonl", size, blob_key))
    _store_dispatch_order(rt, batch_id, result, blob_key, from_file="input_file_id" in body)
    rejections_file_id = None
    if result.rejections:
        rejections_file_id = new_file_id()
        size = _store_rejections(rt, rejections_key(batch_id), result.rejections)
        new_files.append(_file_values(rejections_file_id, key, "batch_output", f"{batch_id}_rejections.jsonl",
                                      size, rejections_key(batch_id)))
    created = now()
    batch = Batch(
        id=batch_id, org_id=key.org_id, key_id=key.id, endpoint=endpoint, input_file_id=input_file_id,
        input_blob_key=blob_key, completion_window="24h", priority=priority, status=BatchStatus.VALIDATING,
        model=result.model or "", created_at=created, expires_at=created + rt.settings.window_seconds,
        total=result.total, failed=len(result.rejections), rejected_count=len(result.rejections),
        rejections_file_id=rejections_file_id, metadata=metadata,
    )
    answer = batch.as_api()
    answer["openrelay"] = unknown_progress()
    answer["rejected_count"] = batch.rejected_count
    if result.rejections:
        answer["rejected_records"] = [r.as_api() for r in result.rejections]
        answer["rejected_records_file_id"] = rejections_file_id
    raw_answer = orjson.dumps(answer)
    rt.batches.create(batch, now_ns(), new_files, claim=claim, answer=raw_answer)
    return raw_answer


_decode_fields = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_requests = msgspec.json.Decoder(list[msgspec.Raw]).decode
_decode_value = msgspec.json.Decoder().decode


def _create_fields(raw: bytes) -> dict[str, Any]:
    """The create's body: ``requests`` as the raw bytes of each request, every other known field decoded.

    Each request is judged (and stored) from its own bytes, exactly like a line of an input file: a request
    the parser refuses (``1e400``, say) is that request's ``invalid_json``, not the whole create's, and what
    the request holds reaches the engine as sent (big integers keep their digits, nesting stays as deep).
    An unknown field is kept undecoded: ``_check_fields`` refuses it by name.
    """
    try:
        fields = _decode_fields(raw)
    except msgspec.ValidationError:
        raise InvalidRequest("request body must be a JSON object") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {_body_problem(raw, exc)}") from None
    body: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "requests":
            try:
                body[name] = _decode_requests(value)
            except (msgspec.DecodeError, RecursionError):
                body[name] = None  # not a list: _check_fields says what requests must be
        elif name in CREATE_FIELDS:
            try:
                body[name] = _decode_value(value)
            except (msgspec.DecodeError, RecursionError) as exc:
                raise InvalidRequest(f"request body is not valid JSON: {name}: {_reason(exc)}",
                                     param=name) from None
        else:
            body[name] = value
    return body


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _body_problem(raw: bytes, exc: BaseException) -> str:
    """What is wrong with a body msgspec refused. orjson says where (line and column), and says "no low
    surrogate" where msgspec says "Input data was truncated"; it is asked only once the body is known bad."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as orjson_exc:
        return str(orjson_exc)
    return _reason(exc)  # e.g. nesting orjson allows and msgspec does not


def _check_fields(body: dict[str, Any], priority: Any) -> tuple[str, dict[str, str] | None]:
    for name in body:
        if name in UNSUPPORTED_FIELDS:
            raise InvalidRequest(UNSUPPORTED_FIELDS[name], param=name)
        if name not in CREATE_FIELDS:
            raise unrecognized_argument(name)
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of: {', '.join(ENDPOINTS)}", param="endpoint")
    if body.get("completion_window") not in WINDOWS:
        raise InvalidRequest('completion_window must be "24h"', param="completion_window")
    if priority not in (Priority.STANDARD.value, Priority.EXPEDITED.value):
        raise InvalidRequest('priority must be "standard" or "expedited"', param="priority")
    metadata = check_metadata(body.get("metadata"))
    has_file, has_inline = "input_file_id" in body, "requests" in body
    if has_file == has_inline:
        raise InvalidRequest("give exactly one of input_file_id and requests", param="input_file_id")
    if has_file and not isinstance(body["input_file_id"], str):
        raise InvalidRequest("input_file_id must be a string", param="input_file_id")
    if has_inline and (not isinstance(body["requests"], list) or not body["requests"]):
        raise InvalidRequest("requests must be a non-empty list of request objects", param="requests")
    if not isinstance(body.get("dry_run", False), bool):
        raise InvalidRequest("dry_run must be true or false", param="dry_run")
    return endpoint, metadata


def check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata must be an object of string values", param="metadata")
    if len(metadata) > 32:
        raise InvalidRequest("metadata takes at most 32 keys", param="metadata")
    for k, v in metadata.items():
        if len(k) > 64:
            raise InvalidRequest(f"metadata key {k[:64]!r}... is longer than 64 characters", param="metadata")
        if not isinstance(v, str):
            raise InvalidRequest(f"metadata value of {k!r} must be a string", param="metadata")
        if len(v) > 512:
            raise InvalidRequest(f"metadata value of {k!r} is longer than 512 characters", param="metadata")
    return metadata or None


def _refuse_no_valid_records(rt: Runtime, key: ApiKey, result: ScanResult, *, store: bool = True) -> None:
    """``store``: keep the rejections as a file (not for a dry run, whose error names none)."""
    file_id = None
    if store:
        file_id = new_file_id()
        blob_key = refused_create_key(file_id)
        size = _store_rejections(rt, blob_key, result.rejections)
        rt.files.add(file_id=file_id, org_id=key.org_id, purpose="batch_output", filename="rejections.jsonl",
                     size=size, blob_key=blob_key)
    raise NoValidRecords(
        f"all {result.total} records were rejected; see rejected_records" if result.total
        else "the input has no records",
        extra={
            "rejected_records": [r.as_api() for r in result.rejections],
            "rejected_records_file_id": file_id,
            "rejected_count": len(result.rejections),
            "request_counts": {"total": result.total, "completed": 0, "failed": result.total},
        },
    )


def _store_rejections(rt: Runtime, blob_key: str, rejections: list[Rejection]) -> int:
    with rt.blobs.writer(blob_key) as out:
        for rejection in rejections:
            out.write(orjson.dumps(rejection.as_api()) + b"\n")
    return rt.blobs.size(blob_key)


def _may_group(catalog: Catalog, endpoint: str) -> bool:
    """Whether a batch on ``endpoint`` could have its records grouped by prompt prefix: the endpoint has prompt
    fields and a model offered for it has ``prefix_grouping`` (which one is the batch's is known after the scan)."""
    return endpoint in PROMPT_FIELDS and any(spec.prefix_grouping and endpoint in spec.endpoints
                                             for spec in catalog.models.values())


def _store_dispatch_order(rt: Runtime, batch_id: str, result: ScanResult, blob_key: str, *, from_file: bool) -> None:
    """The batch's dispatch order (``prefix.DispatchOrder``), when its model groups by prefix and at least two
    of its records share one; otherwise no blob, and the worker runs the records in input order."""
    spec = rt.catalog.models.get(result.model or "")
    if result.prefixes is None or spec is None or not spec.prefix_grouping or not result.prefixes.may_share():
        return
    order = result.prefixes.order(rejected=(r.line for r in result.rejections))
    if not order.groups:
        return
    base = 0
    if from_file:  # the scan counts from the first line; a byte order mark before it stays in the stored file
        with rt.blobs.open(blob_key) as handle:
            base = len(BOM) if handle.read(len(BOM)) == BOM else 0
    with rt.blobs.writer(dispatch_order_key(batch_id)) as out:
        out.write(order.encoded(base))


def _store_inline(rt: Runtime, blob_key: str, requests: list[msgspec.Raw]) -> int:
    """One line per request, its bytes as sent. A newline in JSON can only be whitespace between tokens, so
    turning it into a space keeps every value as it was."""
    with rt.blobs.writer(blob_key) as out:
        for request in requests:
            out.write(bytes(request).replace(b"\n", b" ") + b"\n")
    return rt.blobs.size(blob_key)


def _file_values(file_id: str, key: ApiKey, purpose: str, filename: str, size: int,
                 blob_key: str) -> dict[str, Any]:
    return {"file_id": file_id, "org_id": key.org_id, "purpose": purpose, "filename": filename, "size": size,
            "blob_key": blob_key}


def get_batch(rt: Runtime, key: ApiKey, batch_id: str) -> Batch:
    return run_plan(rt.db, get_batch_plan(rt, key, batch_id))


def get_batch_plan(rt: Runtime, key: ApiKey, batch_id: str) -> Plan[Batch]:
    """``get_batch`` as a plan of reads (``store.compiled``): the API runs it on its event loop."""
    require(key, Scope.BATCH_READ)
    return (yield from rt.batches.get_plan(key.org_id, batch_id))


def list_batches_plan(rt: Runtime, key: ApiKey, *, limit: int, after: str | None, status: str | None,
                      model: str | None, tag: str | None) -> Plan[dict[str, Any]]:
    """A page of ``GET /v1/batches``, as a plan of reads."""
    require(key, Scope.BATCH_READ)
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    if status is not None and status not in {s.value for s in BatchStatus}:
        raise InvalidRequest(f"unknown status {status!r}", param="status")
    found, more = yield from rt.batches.list_api_plan(key.org_id, limit=limit, after=after, status=status,
                                                      model=model, tag=tag)
    return list_page(found, more)


def cancel_batch(rt: Runtime, key: ApiKey, batch_id: str) -> Batch:
    require(key, Scope.BATCH_WRITE)
    return rt.batches.request_cancel(key.org_id, batch_id)


def replace_metadata(rt: Runtime, key: ApiKey, batch_id: str, raw: bytes) -> Batch:
    require(key, Scope.BATCH_WRITE)
    body = json_object(raw)
    if "metadata" not in body:
        raise InvalidRequest("metadata is required (send {} to clear it)", param="metadata")
    rt.batches.get(key.org_id, batch_id)  # 404 before 400: another organization learns nothing
    return rt.batches.set_metadata(key.org_id, batch_id, check_metadata(body["metadata"]) or {})
