"""Batch rows: what the API reads and edits, and what workers claim, lease, advance and settle."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from ..errors import Conflict, NotFound
from ..ids import now
from ..types import (
    BATCH_API_FIELDS,
    CANCELLABLE_VALUES,
    LIVE_VALUES,
    NOT_STORED,
    TERMINAL_VALUES,
    Batch,
    BatchStatus,
    batch_api,
)
from .compiled import All, CompiledRead, First, Plan, run_plan
from .db import Database, holds_nul
from .files import insert_file
from .idempotency import Claim, complete_claim
from .schema import batches
from .tags import insert_tags, replace_tags, tagged

__all__ = ["Batches", "batch_from_row", "batch_values", "LIVE"]

# A batch in one of these statuses still has work for a worker (run, drain or settle).
LIVE = LIVE_VALUES
_TERMINAL = TERMINAL_VALUES


def batch_from_row(row: Row) -> Batch:
    """A whole row of ``batches`` (as the worker's claims read it) as the record."""
    m = row._mapping
    return _batch_from_values(tuple(m[name] for name in _FIELDS))


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
    }


# The columns the API's reads select, in the order of ``Batch``'s fields (every stored field is a column).
_FIELDS = tuple(f.name for f in dataclasses.fields(Batch) if not f.metadata.get(NOT_STORED))
_COLUMNS = tuple(batches.c[name] for name in _FIELDS)
# The columns a list page selects: only what the API shows (``types.batch_api``), 28 of the 39.
_API_COLUMNS = tuple(batches.c[name] for name in BATCH_API_FIELDS)
_API_ERRORS = BATCH_API_FIELDS.index("errors")
_API_METADATA = BATCH_API_FIELDS.index("metadata")
_GET = CompiledRead(sa.select(*_COLUMNS).where(batches.c.id == sa.bindparam("batch_id"),
                                               batches.c.org_id == sa.bindparam("org_id")), cache_by="org_id")
_ANCHOR = CompiledRead(sa.select(batches.c.created_ns, batches.c.id).where(
    batches.c.id == sa.bindparam("batch_id"), batches.c.org_id == sa.bindparam("org_id")), cache_by="org_id")


@functools.cache
def _list_query(*, status: bool, model: bool, tag: bool, after: bool) -> CompiledRead:
    """The page query for one combination of filters, newest first, limited in SQL, selecting
    ``_API_COLUMNS``. Each walks an index backwards and stops after the page: (org_id, created_ns, id)
    unfiltered, (org_id, status, ...) or (org_id, model, ...) filtered, and with a tag the tag's range of
    batch_tags (store/tags.py)."""
    org_id = sa.bindparam("org_id")
    if tag:
        source, conditions, order = tagged(org_id, [sa.bindparam("tag")])
        query = sa.select(*_API_COLUMNS).select_from(source).where(*conditions)
    else:
        order = (batches.c.created_ns, batches.c.id)
        query = sa.select(*_API_COLUMNS).where(batches.c.org_id == org_id)
    if status:
        query = query.where(batches.c.status == sa.bindparam("status"))
    if model:
        query = query.where(batches.c.model == sa.bindparam("model"))
    if after:
        query = query.where(sa.tuple_(*order) < sa.tuple_(sa.bindparam("after_ns"), sa.bindparam("after_id")))
    query = query.order_by(*(column.desc() for column in order))
    return CompiledRead(query.limit(sa.bindparam("rows")), cache_by="org_id")


_STATUSES = {s.value: s for s in BatchStatus}


def _batch_from_values(values: tuple[Any, ...]) -> Batch:
    """A row of ``_COLUMNS`` as the record. It is filled in directly, as the generated ``__init__`` of a frozen
    dataclass does field by field through ``object.__setattr__``: that costs 4 of the 6 microseconds this takes
    per row, and a page has 20 rows. Every stored field is set, since ``_COLUMNS`` has one column per such field;
    one the store does not hold (``NOT_STORED``) reads its default from the class."""
    m = dict(zip(_FIELDS, values, strict=True))
    m["status"] = _STATUSES[m["status"]]
    if m["errors"]:
        m["errors"] = orjson.loads(m["errors"])
    else:
        m["errors"] = None
    if m["metadata"] is not None:
        m["metadata"] = orjson.loads(m["metadata"])
    m["started"] = bool(m["started"])
    record = object.__new__(Batch)
    object.__setattr__(record, "__dict__", m)
    return record


def _api_from_values(values: tuple[Any, ...]) -> dict[str, Any]:
    """A row of ``_API_COLUMNS`` as the API shows it, with no record in between: the page's rows are only
    rendered. Its shape is ``Batch.as_api``'s, from the same function."""
    args = list(values)
    errors = args[_API_ERRORS]
    args[_API_ERRORS] = orjson.loads(errors) if errors else None
    metadata = args[_API_METADATA]
    if metadata is not None:
        args[_API_METADATA] = orjson.loads(metadata)
    return batch_api(*args)


class Batches:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- the API's view -------------------------------------------------------------------------------------

    def create(self, batch: Batch, created_ns: int, new_files: list[dict[str, Any]], *,
               claim: Claim | None = None, answer: bytes = b"") -> None:
        """The batch, the files made for it (inline input, rejections) and, under an Idempotency-Key, the stored
        ``answer`` appear together or not at all."""
        with self.db.write() as conn:
            for values in new_files:
                insert_file(conn, **values)
            conn.execute(batches.insert().values(**batch_values(batch, created_ns)))
            insert_tags(conn, batch_id=batch.id, org_id=batch.org_id, created_ns=created_ns,
                        metadata=batch.metadata)
            if claim is not None:
                complete_claim(conn, claim, answer)

    def get(self, org_id: str, batch_id: str) -> Batch:
        return run_plan(self.db, self.get_plan(org_id, batch_id))

    @staticmethod
    def get_plan(org_id: str, batch_id: str) -> Plan[Batch]:
        """``get`` as a plan (``store.compiled``), which the API's event loop may run without a thread."""
        values = None
        if not holds_nul(batch_id):
            values = yield First(_GET, {"batch_id": batch_id, "org_id": org_id})
        if values is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return _batch_from_values(values)

    def list_api(self, org_id: str, *, limit: int, after: str | None, status: str | None = None,
                 model: str | None = None, tag: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """A page of batches as the API shows them (``Batch.as_api``), newest first, after the batch ``after``
        (404 when the organization has none such); one more row than ``limit`` is read to tell whether there
        are more."""
        return run_plan(self.db, self.list_api_plan(org_id, limit=limit, after=after, status=status, model=model,
                                                    tag=tag))

    @staticmethod
    def list_api_plan(org_id: str, *, limit: int, after: str | None, status: str | None = None,
                      model: str | None = None, tag: str | None = None) -> Plan[tuple[list[dict[str, Any]], bool]]:
        """``list_api`` as a plan."""
        if holds_nul(after):
            raise NotFound(f"No such Batch object: {after}", param="after")
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
        if after:
            anchor = yield First(_ANCHOR, {"batch_id": after, "org_id": org_id})
            if anchor is None:
                raise NotFound(f"No such Batch object: {after}", param="after")
            params["after_ns"], params["after_id"] = anchor
        found = [_api_from_values(v) for v in (yield All(query, params))]
        return found[:limit], len(found) > limit

    def request_cancel(self, org_id: str, batch_id: str) -> Batch:
        if holds_nul(batch_id):
            return self.get(org_id, batch_id)  # the 404 of an unknown id
        with self.db.write() as conn:
            done = conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.org_id == org_id,
                batches.c.status.in_(CANCELLABLE_VALUES),
            ).values(status=BatchStatus.CANCELLING.value, cancelling_at=now(),
                      retry_at=None))  # a batch backing off after a failed run settles its cancel at once
        batch = self.get(org_id, batch_id)
        if done.rowcount == 0 and batch.terminal:
            raise Conflict(f"Cannot cancel a batch with status '{batch.status.value}'.", code="batch_terminal")
        return batch

    def set_metadata(self, org_id: str, batch_id: str, metadata: dict[str, str]) -> Batch:
        """Replace the whole map; its tags' rows are replaced in the same transaction."""
        with self.db.write() as conn:
            created_ns = conn.execute(
                batches.update().where(batches.c.id == batch_id, batches.c.org_id == org_id)
                .values(metadata=orjson.dumps(metadata).decode() if metadata else None)
                .returning(batches.c.created_ns)).scalar()
            if created_ns is None:
                raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
            replace_tags(conn, batch_id=batch_id, org_id=org_id, created_ns=created_ns, metadata=metadata)
        return self.get(org_id, batch_id)

    # -- the scheduler's and workers' view --------------------------------------------------------------------

    def by_id(self, batch_id: str) -> Batch:
        with self.db.read() as conn:
            row = conn.execute(sa.select(batches).where(batches.c.id == batch_id)).first()
        if row is None:
            raise NotFound(f"No such Batch object: {batch_id}")
        return batch_from_row(row)

    def promote_validated(self) -> int:
        """Validated batches join their model's queue (in_progress with in_progress_at still null)."""
        with self.db.write() as conn:
            return conn.execute(batches.update().where(batches.c.status == BatchStatus.VALIDATING.value)
                                .values(status=BatchStatus.IN_PROGRESS.value)).rowcount

    def claim(self, worker_id: str, slots: dict[str, int], lease_seconds: float,
              busy: frozenset[str] = frozenset(), *, runs: bool = True) -> Batch | None:
        """Lease the next batch this worker should act on, or None. ``busy``: batches this worker is acting on
        already; even if their lease lapsed (a stalled heartbeat), it must not start a second run of one.
        ``runs=False``: the worker runs as many batches as it may (``max_batches``); only a batch to settle.

        First a batch that needs no slot: one already started whose lease lapsed (its worker died), one being
        cancelled or finalized, one past its window, or one whose model left the catalog. Then, per model with a
        free slot, the queued batch that comes first (``_next_queued``).

        Atomic however many workers claim at once: the candidate row is locked (``FOR UPDATE SKIP LOCKED`` on
        PostgreSQL, so a racing worker takes the next one; SQLite's write transaction admits one writer), and the
        lease is taken by an update that re-checks the lease is free and must change exactly that row. Times are
        the database's clock.
        """
        models = list(slots)
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            free = sa.or_(batches.c.lease_owner.is_(None), batches.c.lease_expires_at < clock)
            to_settle = [batches.c.status != BatchStatus.IN_PROGRESS.value, batches.c.expires_at <= int(clock),
                         batches.c.model.not_in(models)]
            row = conn.execute(sa.select(batches.c.id).where(
                batches.c.status.in_(LIVE), free, batches.c.id.not_in(busy), _ready(clock),
                sa.or_(*to_settle, *([batches.c.started.is_(True)] if runs else [])),
            ).order_by(batches.c.created_ns).limit(1).with_for_update(skip_locked=True)).first()
            if row is None and runs:
                row = self._next_queued(conn, slots, clock)
            if row is None:
                return None
            taken = conn.execute(batches.update().where(batches.c.id == row.id, free).values(
                lease_owner=worker_id, lease_expires_at=clock + lease_seconds, started=True))
            if taken.rowcount != 1:
                return None  # another worker's claim won; the next tick looks again
            claimed = batch_from_row(conn.execute(sa.select(batches).where(batches.c.id == row.id)).one())
            return claimed.claimed_at(clock)

    def _next_queued(self, conn: Connection, slots: dict[str, int], clock: float) -> Row | None:
        """Per model with a free slot (counted over every worker, under the model's lock): expedited before
        standard, always; within a tier, fair share: the organization with the fewest batches of this model
        running goes first, then the oldest batch. One organization's hundred queued batches cannot hold back
        another's one."""
        for model, model_slots in slots.items():
            self.db.lock_model(conn, model)
            running = conn.execute(sa.select(sa.func.count()).where(
                batches.c.model == model, batches.c.started.is_(True), batches.c.status.in_(LIVE))).scalar_one()
            if running >= model_slots:
                continue
            mine = batches.alias("running_of_org")
            org_running = (sa.select(sa.func.count()).where(
                mine.c.model == model, mine.c.org_id == batches.c.org_id, mine.c.started.is_(True),
                mine.c.status.in_(LIVE)).scalar_subquery())
            row = conn.execute(sa.select(batches.c.id).where(
                batches.c.model == model, batches.c.started.is_(False),
                batches.c.status == BatchStatus.IN_PROGRESS.value, _ready(clock),
            ).order_by(sa.case((batches.c.priority == "expedited", 0), else_=1), org_running, batches.c.created_ns)
              .limit(1)).first()
            if row is not None:
                return row
        return None

    def queue_depths(self) -> dict[str, tuple[int, int]]:
        """Per model: (batches queued, batches running), across every worker on this store."""
        query = (sa.select(batches.c.model, batches.c.started, sa.func.count())
                 .where(batches.c.status == BatchStatus.IN_PROGRESS.value)
                 .group_by(batches.c.model, batches.c.started))
        depths: dict[str, list[int]] = {}
        with self.db.read() as conn:
            for model, started, count in conn.execute(query).all():
                depths.setdefault(model, [0, 0])[1 if started else 0] += count
        return {model: (queued, running) for model, (queued, running) in depths.items()}

    def renew_lease(self, batch_id: str, worker_id: str, lease_seconds: float) -> Batch | None:
        """Extend our lease and read the batch back; None when another worker holds it now."""
        with self.db.write() as conn:
            done = conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                                .values(lease_expires_at=self.db.clock(conn) + lease_seconds))
            if done.rowcount == 0:
                return None
            return batch_from_row(conn.execute(sa.select(batches).where(batches.c.id == batch_id)).one())

    def set_concurrency_limit(self, batch_id: str, worker_id: str, limit: int | None) -> None:
        """Record the adaptive concurrency limit this worker runs the batch at now (the progress object shows it).
        Fenced by the lease: a worker that lost it writes nothing, and is not told (its run ends on the next
        renewal). An unchanged limit writes no row, so it sends no change notice (store/read_cache.py)."""
        with self.db.write() as conn:
            conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.lease_owner == worker_id,
                batches.c.concurrency_limit.is_distinct_from(limit)).values(concurrency_limit=limit))

    def retry_later(self, batch_id: str, worker_id: str, *, failures: int, delay: float) -> None:
        """A run failed for a reason of its own: count it, and give the batch back to the queue (its slot freed)
        until ``delay`` seconds from now."""
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                         .values(lease_owner=None, lease_expires_at=None, started=False, run_failures=failures,
                                 retry_at=self.db.clock(conn) + delay))

    def release(self, batch_id: str, worker_id: str) -> None:
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                         .values(lease_owner=None, lease_expires_at=None))

    def mark_running(self, batch_id: str) -> None:
        """The first request is about to start: the queue wait ends here."""
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.in_progress_at.is_(None))
                         .values(in_progress_at=now()))

    def mark_finalizing(self, batch_id: str, worker_id: str) -> None:
        with self.db.write() as conn:
            conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.lease_owner == worker_id,
                batches.c.status == BatchStatus.IN_PROGRESS.value,
            ).values(status=BatchStatus.FINALIZING.value, finalizing_at=now()))


def _ready(clock: float) -> sa.ColumnElement[bool]:
    """Not waiting out the backoff after a failed run."""
    return sa.or_(batches.c.retry_at.is_(None), batches.c.retry_at <= clock)

