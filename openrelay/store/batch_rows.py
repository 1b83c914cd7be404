"""A row of ``batches`` and the ``Batch`` record, each way: the values a create inserts, the record a read makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from sqlalchemy.engine import Row

from ..types import BATCH_API_FIELDS, NOT_STORED, Batch, BatchStatus, batch_api
from .schema import batches

__all__ = ["batch_from_row", "batch_from_values", "api_from_values", "batch_values", "COLUMNS", "API_COLUMNS"]

# The columns the API's reads select, in the order of ``Batch``'s fields (every stored field is a column).
_FIELDS = tuple(f.name for f in dataclasses.fields(Batch) if not f.metadata.get(NOT_STORED))
COLUMNS = tuple(batches.c[name] for name in _FIELDS)
# The columns a list page selects: only what the API shows (``types.batch_api``).
API_COLUMNS = tuple(batches.c[name] for name in BATCH_API_FIELDS)
_API_ERRORS = BATCH_API_FIELDS.index("errors")
_API_METADATA = BATCH_API_FIELDS.index("metadata")
_API_THRESHOLD = BATCH_API_FIELDS.index("failure_threshold")
_STATUSES = {s.value: s for s in BatchStatus}


def batch_from_row(row: Row) -> Batch:
    """A whole row of ``batches`` (as the worker's claims read it) as the record."""
    m = row._mapping
    return batch_from_values(tuple(m[name] for name in _FIELDS))


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


def batch_from_values(values: tuple[Any, ...]) -> Batch:
    """A row of ``COLUMNS`` as the record. It is filled in directly, as the generated ``__init__`` of a frozen
    dataclass does field by field through ``object.__setattr__``: that costs 4 of the 6 microseconds this takes
    per row, and a page has 20 rows. Every stored field is set, since ``COLUMNS`` has one column per such field;
    one the store does not hold (``NOT_STORED``) reads its default from the class."""
    m = dict(zip(_FIELDS, values, strict=True))
    m["status"] = _STATUSES[m["status"]]
    if m["errors"]:
        m["errors"] = orjson.loads(m["errors"])
    else:
        m["errors"] = None
    if m["metadata"] is not None:
        m["metadata"] = orjson.loads(m["metadata"])
    if m["failure_threshold"] is not None:
        m["failure_threshold"] = orjson.loads(m["failure_threshold"])
    m["started"] = bool(m["started"])
    record = object.__new__(Batch)
    object.__setattr__(record, "__dict__", m)
    return record


def api_from_values(values: tuple[Any, ...]) -> dict[str, Any]:
    """A row of ``API_COLUMNS`` as the API shows it, with no record in between: the page's rows are only
    rendered. Its shape is ``Batch.as_api``'s, from the same function."""
    args = list(values)
    errors = args[_API_ERRORS]
    args[_API_ERRORS] = orjson.loads(errors) if errors else None
    metadata = args[_API_METADATA]
    if metadata is not None:
        args[_API_METADATA] = orjson.loads(metadata)
    if args[_API_THRESHOLD] is not None:
        args[_API_THRESHOLD] = orjson.loads(args[_API_THRESHOLD])
    return batch_api(*args)
