"""Reading a claimed batch's input back: which records still need to run, and where its blobs live."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from ..blobs.base import BlobStore
from ..blobs.keys import rejections_key
from ..types import Batch, Rejection
from ..validation.lines import numbered_lines

__all__ = ["read_rejections", "pending_records", "load_record", "Unreadable"]


def read_rejections(blobs: BlobStore, batch: Batch) -> list[Rejection]:
    if not batch.rejected_count:
        return []
    with blobs.open(rejections_key(batch.id)) as handle:
        return [Rejection(**orjson.loads(raw)) for raw in handle if raw.strip()]


@dataclass(frozen=True, kw_only=True)
class Unreadable:
    """An accepted record this worker cannot decode (a batch created before the create refused what it holds):
    it ends as an error line of its own instead of stopping the batch."""

    custom_id: str
    message: str


def pending_records(blobs: BlobStore, batch: Batch, skip: set[int],
                    max_line_bytes: int) -> Iterator[tuple[int, dict[str, Any] | Unreadable]]:
    """(line, record) of every accepted record whose line is not in ``skip``, in input order."""
    with blobs.open(batch.input_blob_key) as handle:
        for line, raw in numbered_lines(handle, max_line_bytes):
            if line not in skip:
                yield line, load_record(raw)


def load_record(raw: bytes) -> Any:
    """An accepted record, every value as it was written: msgspec keeps integers of any size (orjson would turn
    one past 64 bits into a float), and floats, strings and key order as orjson does. orjson reads nesting a
    little deeper than msgspec, up to the create's limit, so it reads what msgspec cannot."""
    try:
        return _generic_decode(raw)
    except (msgspec.DecodeError, RecursionError, ValueError):
        pass
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        why = str(exc)
    try:
        custom_id = _custom_id_decode(raw).custom_id
    except (msgspec.DecodeError, RecursionError, ValueError):
        custom_id = ""
    return Unreadable(custom_id=custom_id, message=f"the record cannot be read: {why}")


class _CustomIdOnly(msgspec.Struct):
    custom_id: str = ""


_generic_decode = msgspec.json.Decoder().decode
_custom_id_decode = msgspec.json.Decoder(_CustomIdOnly).decode
