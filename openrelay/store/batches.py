"""Batch rows as the API sees them: create, read, list, cancel, metadata. The workers' claims, leases and retry
marks are ``store/leases.py``'s; row and record, each way, ``store/batch_rows.py``'s."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import sqlalchemy as sa

from ..errors import Conflict, no_such
from ..ids import now
from ..types import CANCELLABLE_VALUES, TERMINAL_VALUES, ApiKey, Batch, BatchStatus
from .batch_rows import API_COLUMNS, COLUMNS, api_from_values, batch_from_values, batch_values
from .budgets import reserve
from .db import Database, holds_nul
from .ended_counts import count_ended
from .files import insert_file
from .idempotency import Claim, complete_claim
from .schema import batches
from .tags import insert_tags, replace_tags, tagged

__all__ = ["Batches"]

_GET = sa.select(*COLUMNS).where(batches.c.id == sa.bindparam("batch_id"), batches.c.org_id == sa.bindparam("org_id"))
_INSERT = batches.insert()
_ANCHOR = sa.select(batches.c.created_ns, batches.c.id).where(
    batches.c.id == sa.bindparam("batch_id"), batches.c.org_id == sa.bindparam("org_id"))


@functools.cache
def _list_query(*, status: bool, model: bool, tag: bool, after: bool) -> sa.Select:
    """The page query for one combination of filters, newest first, limited in SQL, selecting
    ``API_COLUMNS``. Each walks an index backwards and stops after the page: (org_id, created_ns, id)
    unfiltered, (org_id, status, ...) or (org_id, model, ...) filtered, and with a tag the tag's range of
    batch_tags (store/tags.py)."""
    org_id = sa.bindparam("org_id")
    if tag:
        source, conditions, order = tagged(org_id, [sa.bindparam("tag")])
        query = sa.select(*API_COLUMNS).select_from(source).where(*conditions)
    else:
        order = (batches.c.created_ns, batches.c.id)
        query = sa.select(*API_COLUMNS).where(batches.c.org_id == org_id)
    if status:
        query = query.where(batches.c.status == sa.bindparam("status"))
    if model:
        query = query.where(batches.c.model == sa.bindparam("model"))
    if after:
        query = query.where(sa.tuple_(*order) < sa.tuple_(sa.bindparam("after_ns"), sa.bindparam("after_id")))
    query = query.order_by(*(column.desc() for column in order))
    return query.limit(sa.bindparam("rows"))


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
            # The row goes as the statement's parameters, not its values(): the statement is then the same object
            # each time, its cache key and compiled form made once (values() cost a new one each create: 0.7 ms
            # against 0.4 ms for the whole transaction, in process).
            conn.execute(_INSERT, {**batch_values(batch, created_ns),
                                   "reserved_nano_usd": max_cost_nano_usd if reserve_for else 0,
                                   "output_expires_seconds": output_expires_seconds})
            insert_tags(conn, batch_id=batch.id, org_id=batch.org_id, created_ns=created_ns,
                        metadata=batch.metadata)
            if claim is not None:
                complete_claim(conn, claim, answer)

    def get(self, org_id: str, batch_id: str) -> Batch:
        values = None
        if not holds_nul(batch_id):
            with self.db.read() as conn:
                values = conn.execute(_GET, {"batch_id": batch_id, "org_id": org_id}).first()
        if values is None:
            raise no_such("Batch", batch_id, param="batch_id")
        return batch_from_values(values)

    def list_api(self, org_id: str, *, limit: int, after: str | None, status: str | None = None,
                 model: str | None = None, tag: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """A page of batches as the API shows them (``Batch.as_api``), newest first, after the batch ``after``
        (404 when the organization has none such); one more row than ``limit`` is read to tell whether there
        are more."""
        if holds_nul(after):
            raise no_such("Batch", after, param="after")
        if holds_nul(model, tag):
            return [], False  # no batch's model or tag holds NUL (and PostgreSQL cannot be asked about one)
        params: dict[str, Any] = {"org_id": org_id, "rows": limit + 1}
        if status:
            params["status"] = status
        if model:
            params["model"] = model
        if tag:
            params["tag"] = tag  # one tag, exactly as sent: it equals a stored (trimmed) tag or nothing
        query = _list_query(status=bool(status), model=bool(model), tag=bool(tag), after=bool(after))
        with self.db.read() as conn:
            if after:
                anchor = conn.execute(_ANCHOR, {"batch_id": after, "org_id": org_id}).first()
                if anchor is None:
                    raise no_such("Batch", after, param="after")
                params["after_ns"], params["after_id"] = anchor
            found = [api_from_values(v) for v in conn.execute(query, params)]
        return found[:limit], len(found) > limit

    def request_cancel(self, org_id: str, batch_id: str) -> Batch:
        if holds_nul(batch_id):
            return self.get(org_id, batch_id)  # the 404 of an unknown id
        with self.db.write() as conn:
            done = conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.org_id == org_id,
                batches.c.status.in_(CANCELLABLE_VALUES),
            ).values(status=BatchStatus.CANCELLING.value, cancelling_at=now(),
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
