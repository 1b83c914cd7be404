"""Creating a batch (docs/api-contract.md §3, in its order), and the answer a create or its dry run gives."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import msgspec
import orjson

from .. import tracing
from ..blobs.base import BlobStore
from ..blobs.keys import dispatch_order_key, file_key, refused_create_key, rejections_key
from ..catalog import Catalog
from ..clock import now, now_ns
from ..errors import BudgetExceeded, Conflict, InvalidRequest, NoValidRecords, StoreError
from ..failure_threshold import FailureThreshold, parse_failure_threshold
from ..ids import new_batch_id, new_file_id
from ..prefix import PROMPT_FIELDS
from ..runtime import Runtime
from ..store.budgets import over_budget
from ..store.files import Files
from ..store.idempotency import Claim, Stored
from ..types import ApiKey, Batch, BatchStatus, Priority, Rejection, Scope, unknown_progress
from ..validation.lines import BOM, Block
from ..validation.scan import ScanResult, file_lines, inline_lines, scan_records
from .auth import require, require_budget
from .create_body import check_create_fields, decode_create_body
from .estimate import estimate
from .expiry import output_expiry

__all__ = ["create_batch", "MAX_IDEMPOTENCY_KEY_BYTES"]

MAX_IDEMPOTENCY_KEY_BYTES = 512


def create_batch(rt: Runtime, key: ApiKey, raw: bytes, idempotency_key: str | None = None, *,
                 keep_all_rejected: bool = False) -> bytes:
    """The create's 200 body, as bytes: under an Idempotency-Key they are stored and replayed exactly.

    ``idempotency_key`` is the header as HTTP delivers it, decoded as latin-1 (one character per byte).
    ``keep_all_rejected``: a create whose every record is rejected still makes its batch, which ends with them as
    its error lines, instead of answering ``no_valid_records`` (Anthropic's route, service/message_batches.py).
    Steps 1 to 3 of docs/api-contract.md §3 are here, the rest in ``_create``.
    """
    try:
        body, bad_body = decode_create_body(raw), None
    except InvalidRequest as exc:
        # docs/api-contract.md §3 puts 403, 402 and idempotency before anything of the request: a malformed body
        # comes after.
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
        with tracing.span("batch create", {"openrelay.org_id": key.org_id}):
            return _create(rt, key, body, claim, keep_all_rejected)
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


def _create(rt: Runtime, key: ApiKey, body: dict[str, Any], claim: Claim | None, keep_all_rejected: bool) -> bytes:
    """Steps 4 to 8 of docs/api-contract.md §3; a key with a hard budget (``store/budgets.py``) also has the
    batch's maximum cost reserved after step 7, or 402."""
    priority = body.get("priority", Priority.STANDARD.value)
    if priority == Priority.EXPEDITED.value and not rt.accounts.org(key.org_id).expedited_enabled:
        raise Conflict('priority "expedited" is not enabled for this organization', code="feature_disabled")
    endpoint, metadata = check_create_fields(body, priority)
    threshold = parse_failure_threshold(body.get("failure_threshold"))
    output_expires = output_expiry(body.get("output_expires_after"),
                                   min_seconds=rt.settings.retention.min_expiry_seconds)
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
                yield from file_lines(handle, rt.settings.batches.max_line_bytes)

        source: Callable[[], Iterable[Any]] = blocks
    else:
        requests: list[msgspec.Raw] = body["requests"]
        source = functools.partial(inline_lines, requests)
        input_file_id, blob_key = new_file_id(), ""
    dry_run = body.get("dry_run") is True
    result = scan_records(source, endpoint=endpoint, catalog=rt.catalog, max_records=rt.settings.batches.max_records,
                          collect_prefixes=dry_run or _may_group(rt.catalog, endpoint))
    if result.accepted == 0 and not keep_all_rejected:
        _refuse_no_valid_records(rt.files, rt.blobs, key, result, store=not dry_run,
                                 hint=_not_jsonl_hint(source) if blob_key else "")
    found, max_cost = None, 0
    if dry_run or key.has_hard_budget():
        found = estimate(rt.catalog, source=source, result=result, endpoint=endpoint, priority=priority)
        max_cost = found["max_cost_nano_usd"]
        if key.has_hard_budget() and not key.fits(max_cost):  # the key as read now; the create's transaction rechecks
            raise over_budget(key, max_cost)
    if dry_run:  # every check done: answer as the create would, making and storing nothing
        batch = _new_batch(key, result, window_seconds=rt.settings.batches.window_seconds, batch_id="",
                           endpoint=endpoint, priority=priority, metadata=metadata, input_file_id="", blob_key="",
                           rejections_file_id=None, threshold=threshold)
        return _dry_run_answer(batch, result, found, input_file_id=None if blob_key == "" else input_file_id)
    if not blob_key:
        blob_key = file_key(input_file_id)
        size = _store_inline(rt.blobs, blob_key, body["requests"])
        new_files.append(_file_values(input_file_id, key, "batch", f"{batch_id}_requests.jsonl", size, blob_key))
    _store_dispatch_order(rt.blobs, rt.catalog, batch_id, result, blob_key, from_file="input_file_id" in body)
    rejections_file_id = None
    if result.rejections:
        rejections_file_id = new_file_id()
        size = _store_rejections(rt.blobs, rejections_key(batch_id), result.rejections)
        new_files.append(_file_values(rejections_file_id, key, "batch_output", f"{batch_id}_rejections.jsonl",
                                      size, rejections_key(batch_id)))
    batch = _new_batch(key, result, window_seconds=rt.settings.batches.window_seconds, batch_id=batch_id,
                       endpoint=endpoint, priority=priority, metadata=metadata, input_file_id=input_file_id,
                       blob_key=blob_key, rejections_file_id=rejections_file_id, threshold=threshold)
    if result.accepted == 0:  # nothing to run: a worker ends it at once, its rejections its error lines
        batch = dataclasses.replace(batch, status=BatchStatus.FINALIZING)
    tracing.note("openrelay.batch_id", batch_id)
    raw_answer = orjson.dumps(_answer(batch, result, unknown_progress()))
    try:
        rt.batches.create(batch, now_ns(), new_files, claim=claim, answer=raw_answer,
                          reserve_for=key if key.has_hard_budget() else None, max_cost_nano_usd=max_cost,
                          output_expires_seconds=output_expires)
    except BudgetExceeded:  # concurrent creates reserved what was left first: the blobs stored for this one go
        for written in [f["blob_key"] for f in new_files] + [dispatch_order_key(batch_id)]:
            with contextlib.suppress(StoreError):  # the 402 is the answer; a blob left behind names no file
                rt.blobs.delete(written)
        raise
    return raw_answer


def _new_batch(key: ApiKey, result: ScanResult, *, window_seconds: int, batch_id: str, endpoint: str,
               priority: str, metadata: dict[str, str] | None, input_file_id: str, blob_key: str,
               rejections_file_id: str | None, threshold: FailureThreshold | None) -> Batch:
    """The batch a create makes of its scanned records, validating, created now, expiring ``window_seconds``
    later."""
    created = now()
    return Batch(
        id=batch_id, org_id=key.org_id, key_id=key.id, endpoint=endpoint, input_file_id=input_file_id,
        input_blob_key=blob_key, completion_window="24h", priority=priority, status=BatchStatus.VALIDATING,
        model=result.model or "", created_at=created, expires_at=created + window_seconds,
        total=result.total, failed=len(result.rejections), rejected_count=len(result.rejections),
        rejections_file_id=rejections_file_id, metadata=metadata,
        failure_threshold=threshold.as_api() if threshold is not None else None,
    )


def _answer(batch: Batch, result: ScanResult, progress: dict[str, Any]) -> dict[str, Any]:
    """The create's 200: the batch object, its ``openrelay`` progress, and the records the scan rejected."""
    answer = batch.as_api()
    answer["openrelay"] = progress
    answer["rejected_count"] = batch.rejected_count
    if result.rejections:
        answer["rejected_records"] = [r.as_api() for r in result.rejections]
        answer["rejected_records_file_id"] = batch.rejections_file_id
    return answer


def _dry_run_answer(batch: Batch, result: ScanResult, found: dict[str, Any] | None, *,
                    input_file_id: str | None) -> bytes:
    """The create's 200 as it would have been, for a batch that is not made: ``"id": null``, ``"dry_run": true``
    and ``openrelay.estimate`` (``found``, ``service/estimate.py``). ``input_file_id`` is None for inline requests
    and ``rejected_records_file_id`` null: no file is stored for either."""
    progress = {**unknown_progress(), "estimate": found}
    answer = _answer(batch, result, progress)
    answer["id"] = None
    answer["input_file_id"] = input_file_id
    answer["dry_run"] = True
    return orjson.dumps(answer)


def _refuse_no_valid_records(files: Files, blobs: BlobStore, key: ApiKey, result: ScanResult, *,
                             store: bool = True, hint: str = "") -> None:
    """``store``: keep the rejections as a file (not for a dry run, whose error names none); ``hint``: a sentence
    the message ends with."""
    file_id = None
    if store:
        file_id = new_file_id()
        blob_key = refused_create_key(file_id)
        size = _store_rejections(blobs, blob_key, result.rejections)
        files.add(file_id=file_id, org_id=key.org_id, purpose="batch_output", filename="rejections.jsonl",
                     size=size, blob_key=blob_key)
    raise NoValidRecords(
        (f"all {result.total} records were rejected; see rejected_records" if result.total
         else "the input has no records") + hint,
        extra={
            "rejected_records": [r.as_api() for r in result.rejections],
            "rejected_records_file_id": file_id,
            "rejected_count": len(result.rejections),
            "request_counts": {"total": result.total, "completed": 0, "failed": result.total},
        },
    )


def _not_jsonl_hint(source: Callable[[], Iterable[Block]]) -> str:
    """For an input file every record of which was rejected: a sentence saying it must be JSONL, when its first
    line opens a JSON array or is a lone ``{`` (pretty-printed JSON); else nothing."""
    blocks = iter(source())
    try:
        first = next((line.removeprefix(BOM).strip() for block in blocks for line in block.lines
                      if line.removeprefix(BOM).strip()), b"")
    finally:
        if isinstance(blocks, Generator):  # the stored file's reader: let go of the blob now
            blocks.close()
    if first.startswith(b"["):
        return (". The input must be JSONL, one request object per line; it looks like a JSON array: write "
                "each element on a line of its own")
    if first == b"{":
        return (". The input must be JSONL, one request object per line; it looks like pretty-printed JSON: "
                "write each request on a single line")
    return ""


def _store_rejections(blobs: BlobStore, blob_key: str, rejections: list[Rejection]) -> int:
    with blobs.writer(blob_key) as out:
        for rejection in rejections:
            out.write(orjson.dumps(rejection.as_api()) + b"\n")
    return blobs.size(blob_key)


def _may_group(catalog: Catalog, endpoint: str) -> bool:
    """Whether a batch on ``endpoint`` could have its records grouped by prompt prefix: the endpoint has prompt
    fields and a model offered for it has ``prefix_grouping`` (which one is the batch's is known after the scan)."""
    return endpoint in PROMPT_FIELDS and any(spec.prefix_grouping and endpoint in spec.endpoints
                                             for spec in catalog.models.values())


def _store_dispatch_order(blobs: BlobStore, catalog: Catalog, batch_id: str, result: ScanResult, blob_key: str, *,
                          from_file: bool) -> None:
    """The batch's dispatch order (``prefix.DispatchOrder``), when its model groups by prefix and at least two
    of its records share one; otherwise no blob, and the worker runs the records in input order."""
    spec = catalog.models.get(result.model or "")
    if result.prefixes is None or spec is None or not spec.prefix_grouping or not result.prefixes.may_share():
        return
    order = result.prefixes.order(rejected=(r.line for r in result.rejections))
    if not order.groups:
        return
    base = 0
    if from_file:  # the scan counts from the first line; a byte order mark before it stays in the stored file
        with blobs.open(blob_key) as handle:
            base = len(BOM) if handle.read(len(BOM)) == BOM else 0
    with blobs.writer(dispatch_order_key(batch_id)) as out:
        out.write(order.encoded(base))


def _store_inline(blobs: BlobStore, blob_key: str, requests: list[msgspec.Raw]) -> int:
    """One line per request, its bytes as sent. A newline in JSON can only be whitespace between tokens, so
    turning it into a space keeps every value as it was."""
    with blobs.writer(blob_key) as out:
        for request in requests:
            out.write(bytes(request).replace(b"\n", b" ") + b"\n")
    return blobs.size(blob_key)


def _file_values(file_id: str, key: ApiKey, purpose: str, filename: str, size: int,
                 blob_key: str) -> dict[str, Any]:
    return {"file_id": file_id, "org_id": key.org_id, "purpose": purpose, "filename": filename, "size": size,
            "blob_key": blob_key}
