"""The pieces a running batch's result file is made of so far: its kind's chunk blobs in ``seq`` order, with
their sizes and line counts, read from the chunk rows alone (``service/partial_results.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from .db import Database
from .schema import batch_chunks

__all__ = ["Segment", "result_segments"]


@dataclass(frozen=True, kw_only=True)
class Segment:
    key: str  # the chunk's blob
    size: int | None  # its bytes; None for a chunk committed before migration 0009 (ask the blob store)
    lines: int


def result_segments(db: Database, batch_id: str, kind: str) -> list[Segment]:
    """``kind`` ``output``: the chunks' ``out`` blobs; ``error``: their ``err`` blobs. One read, so the list is a
    prefix of the chunks the batch will ever have (they are committed one after another, in ``seq`` order)."""
    c = batch_chunks.c
    key, size, lines = (c.out_key, c.out_bytes, c.completed) if kind == "output" else (c.err_key, c.err_bytes,
                                                                                       c.failed)
    with db.read() as conn:
        rows = conn.execute(sa.select(key, size, lines).where(c.batch_id == batch_id, key.is_not(None))
                            .order_by(c.seq)).all()
    return [Segment(key=r[0], size=None if r[1] is None else int(r[1]), lines=int(r[2])) for r in rows]
