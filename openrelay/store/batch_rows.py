"""A row of ``batches`` and the ``Batch`` record, each way: the values a create inserts, the record a read makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from sqlalchemy.engine import Row

from ..types import NOT_STORED, Batch, BatchStatus

__all__ = ["batch_from_row", "batch_values"]

_FIELDS = tuple(f.name for f in dataclasses.fields(Batch) if not f.metadata.get(NOT_STORED))  # each a column


def batch_from_row(row: Row) -> Batch:
    """A whole row of ``batches`` as the record; a field the store has no column for (``NOT_STORED``) keeps its
    default."""
    mapping = row._mapping
    m = {name: mapping[name] for name in _FIELDS}
    m["status"] = BatchStatus(m["status"])
    m["errors"] = orjson.loads(m["errors"]) if m["errors"] else None  # an empty list shows as none
    for name in ("metadata", "failure_threshold"):
        if m[name] is not None:
            m[name] = orjson.loads(m[name])
    m["started"], m["yielding"] = bool(m["started"]), bool(m["yielding"])
    return Batch(**m)


def batch_values(batch: Batch, created_ns: int) -> dict[str, Any]:
    return {
        "id": batch.id, "org_id": batch.org_id, "key_id": batch.key_id, "endpoint": batch.endpoint,
        "input_file_id": batch.input_file_id, "input_blob_key": batch.input_blob_key,
        "completion_window": batch.completion_window, "priority": batch.priority, "status": batch.status.value,
        "model": batch.model, "created_at": batch.created_at, "created_ns": created_ns,
        "expires_at": batch.expires_at, "total": batch.total, "completed": 0, "failed": batch.failed,
        "rejected_count": batch.rejected_count, "rejections_file_id": batch.rejections_file_id,
        "input_tokens": 0, "cached_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0, "cost_nano_usd": 0,
        "started": False,
        "metadata": orjson.dumps(batch.metadata).decode() if batch.metadata is not None else None,
        "failure_threshold": (orjson.dumps(batch.failure_threshold).decode()
                              if batch.failure_threshold is not None else None),
    }

