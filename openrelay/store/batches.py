"""Batch rows as the API sees them: create, read, cancel, metadata (a list: ``store/batch_search.py``). The workers'
claims, leases and retry marks are ``store/leases.py``'s; row and record, each way, ``store/batch_rows.py``'s."""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa

from ..clock import now
from ..errors import Conflict, no_such
from ..lifecycle import CANCEL
from ..types import TERMINAL_VALUES, ApiKey, Batch
from .batch_rows import batch_from_row, batch_values
from .budgets import reserve
from .db import Database, holds_nul, in_order_after
from .ended_counts import count_ended
from .files import insert_file
from .idempotency import Claim, complete_claim
from .schema import batches
from .tags import insert_tags, replace_tags

__all__ = ["Batches"]

_GET = sa.select(batches).where(batches.c.id == sa.bindparam("batch_id"), batches.c.org_id == sa.bindparam("org_id"))
_INSERT = batches.insert()


class Batches:
    """Batch rows as the API reads and edits them (the workers' claims and leases: ``store/leases.py``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, batch: Batch, created_ns: int, new_files: list[dict[str, Any]], *,
               claim: Claim | None = None, answer: bytes = b"", reserve_for: ApiKey | None = None,
               max_cost_nano_usd: int = 0, output_expires_seconds: int | None = None) -> None:
        """The batch, the files made for it (inline input, rejections) and, under an Idempotency-Key, the stored
        ``answer`` appear together or not at all. ``reserve_for``: the key with a hard budget whose reservation of
        ``max_cost_nano_usd`` is taken in the same transaction, or nothing is made (402, ``store/budgets.py``).
        ``output_expires_seconds``: its result files' expiry, which ``Results.finalize`` reads when it makes them."""
        with self.db.write() as conn:
            if reserve_for is not None:
                reserve(conn, reserve_for, max_cost_nano_usd)
            for values in new_files:
                insert_file(conn, **values)
            # As parameters, not values(): one statement object, compiled once (values() cost 0.7 ms a create).
            conn.execute(_INSERT, {**batch_values(batch, created_ns),
                                   "reserved_nano_usd": max_cost_nano_usd if reserve_for else 0,
                                   "output_expires_seconds": output_expires_seconds})
            insert_tags(conn, batch_id=batch.id, org_id=batch.org_id, created_ns=created_ns,
                        metadata=batch.metadata)
            if claim is not None:
                complete_claim(conn, claim, answer)

    def get(self, org_id: str, batch_id: str) -> Batch:
        row = None
        if not holds_nul(batch_id):
            with self.db.read() as conn:
                row = conn.execute(_GET, {"batch_id": batch_id, "org_id": org_id}).first()
        if row is None:
            raise no_such("Batch", batch_id, param="batch_id")
        return batch_from_row(row)

    def list_of_endpoint(self, org_id: str, endpoint: str, *, limit: int, after: str | None = None,
                         before: str | None = None) -> tuple[list[Batch], bool]:
        """A page of the organization's batches on ``endpoint``, newest first: after the batch ``after``, or the
        page just before ``before`` (404 for an anchor it has none such of); and whether more lie that way. Index
        ``ix_batches_org_endpoint_order``."""
        query = sa.select(batches).where(batches.c.org_id == org_id, batches.c.endpoint == endpoint)
        with self.db.read() as conn:
            query = in_order_after(conn, batches, query, org_id=org_id, after=after or before, kind="Batch",
                                   oldest_first=bool(before), param="after_id" if after else "before_id")
            rows = conn.execute(query.limit(limit + 1)).all()
        found = [batch_from_row(row) for row in rows[:limit]]
        return (found[::-1] if before else found), len(rows) > limit

    def request_cancel(self, org_id: str, batch_id: str) -> Batch:
        if holds_nul(batch_id):
            return self.get(org_id, batch_id)  # the 404 of an unknown id
        with self.db.write() as conn:
            done = conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.org_id == org_id,
                batches.c.status.in_(CANCEL.source_values),
            ).values(status=CANCEL.to.value, cancelling_at=now(),
                      retry_at=None))  # a batch backing off after a failed run has its cancel done at once
        batch = self.get(org_id, batch_id)
        if done.rowcount == 0 and batch.terminal:
            raise Conflict(f"Cannot cancel a batch with status '{batch.status.value}'.", code="batch_terminal")
        return batch

    def set_metadata(self, org_id: str, batch_id: str, metadata: dict[str, str]) -> Batch:
        """Replace the whole map; its tags' rows are replaced in the same transaction, and so, for an ended
        batch, are its tags' counters (store/ended_counts.py)."""
        with self.db.write() as conn:
            changed = conn.execute(
                batches.update().where(batches.c.id == batch_id, batches.c.org_id == org_id)
                .values(metadata=orjson.dumps(metadata).decode() if metadata else None)
                .returning(batches.c.created_ns, batches.c.status)).first()
            if changed is None:
                raise no_such("Batch", batch_id, param="batch_id")
            ended = changed.status in TERMINAL_VALUES
            if ended:
                count_ended(conn, [batch_id], sign=-1)
            replace_tags(conn, batch_id=batch_id, org_id=org_id, created_ns=changed.created_ns, metadata=metadata)
            if ended:
                count_ended(conn, [batch_id], sign=1)
        return self.get(org_id, batch_id)
