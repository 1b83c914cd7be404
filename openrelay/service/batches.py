"""Batches past their create (``service/create.py``): read, list, cancel, replace metadata."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest
from ..store.batch_search import BatchQuery, search
from ..store.batches import Batches
from ..types import ApiKey, Batch, BatchStatus, Scope
from .auth import require
from .bodies import json_object, list_page
from .create import create_batch
from .create_body import check_metadata

# create_batch is the create's (service/create.py), named here too for the API and the dashboard, which call it
# as batch_service.create_batch beside this module's reads.
__all__ = ["create_batch", "get_batch", "list_batches", "cancel_batch", "replace_metadata"]


def get_batch(batches: Batches, key: ApiKey, batch_id: str) -> Batch:
    require(key, Scope.BATCH_READ)
    return batches.get(key.org_id, batch_id)


def list_batches(batches: Batches, key: ApiKey, *, limit: int, after: str | None, status: str | None,
                 model: str | None, tag: str | None) -> dict[str, Any]:
    """A page of ``GET /v1/batches``: the dashboard's search (``store/batch_search.py``) under the API's filters."""
    require(key, Scope.BATCH_READ)
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    if status is not None and status not in {s.value for s in BatchStatus}:
        raise InvalidRequest(f"unknown status {status!r}", param="status")
    query = BatchQuery(status=status, model=model, tags=(tag,) if tag else ())
    found, more = search(batches.db, key.org_id, query, limit=limit, after=after)
    return list_page([batch.as_api() for batch in found], more)


def cancel_batch(batches: Batches, key: ApiKey, batch_id: str) -> Batch:
    require(key, Scope.BATCH_WRITE)
    return batches.request_cancel(key.org_id, batch_id)


def replace_metadata(batches: Batches, key: ApiKey, batch_id: str, raw: bytes) -> Batch:
    require(key, Scope.BATCH_WRITE)
    body = json_object(raw)
    if "metadata" not in body:
        raise InvalidRequest("metadata is required (send {} to clear it)", param="metadata")
    batches.get(key.org_id, batch_id)  # 404 before 400: another organization learns nothing
    return batches.set_metadata(key.org_id, batch_id, check_metadata(body["metadata"]) or {})
