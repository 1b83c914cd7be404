"""The workers' side of batch rows: validated batches queued, claims and leases, the marks a lease fences, and
the retry mark that gives a failed run back to the queue. Every time here is the database's clock."""

from __future__ import annotations

import functools
from collections.abc import Collection

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from ..clock import now, seconds
from ..errors import no_such
from ..lifecycle import ALL_LINED, QUEUE
from ..types import CLAIMABLE_VALUES, Batch, BatchStatus
from .batch_rows import batch_from_row
from .db import Database
from .fair_share import Share, fair_queue, read_shares, record_start
from .schema import batches

__all__ = ["BatchLeases", "end_run"]


class BatchLeases:
    """What the scheduler and workers do to batch rows (``store/batches.py``'s ``Batches`` has these too)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def by_id(self, batch_id: str) -> Batch:
        with self.db.read() as conn:
            row = conn.execute(_BY_ID, {"batch_id": batch_id}).first()
        if row is None:
            raise no_such("Batch", batch_id)
        return batch_from_row(row)

    def claim(self, worker_id: str, slots: dict[str, int], lease_seconds: float,
              busy: frozenset[str] = frozenset(), *, runs: bool = True,
              start_models: Collection[str] | None = None) -> Batch | None:
        """Lease the next batch this worker should act on, or None. ``busy``: batches this worker is acting on
        already; even if their lease lapsed (a stalled heartbeat), it must not start a second run of one.
        ``runs=False``: the worker runs as many batches as it may (``max_batches``); only a batch to end.
        ``start_models``: the models it may run one more batch of (its share of their slots, ``worker/share.py``);
        None: every model.

        Validated batches join their queues first; then a batch that needs no slot (``_to_end``); then, per model
        with a free slot, the queued batch that comes first (``_next_queued``). Atomic however many workers claim
        at once (docs/guarantees.md). ``from_queue``: no batch to end was waiting when it was claimed.
        """
        with self.db.write() as conn:
            conn.execute(_PROMOTE)
            local = seconds()  # read just before the database's clock: the skew to it (``Batch.claimed_at``)
            clock = self.db.clock(conn)
            params: dict[str, object] = {"clock": clock, "clock_s": int(clock), "models": list(slots),
                                         "busy": list(busy)}
            if start_models is not None:
                params["start_models"] = list(start_models)
            row = conn.execute(_to_end(runs=runs, some_models=start_models is not None), params).first()
            queued = None
            if row is None and runs:
                may_start = slots if start_models is None else {m: n for m, n in slots.items() if m in start_models}
                row = queued = self._next_queued(conn, may_start, clock)
            if row is None:
                return None
            taken = conn.execute(_TAKE, {"batch_id": row.id, "clock": clock, "owner": worker_id,
                                         "until": clock + lease_seconds}).first()
            if taken is None:
                return None  # another worker's claim won; the next tick looks again
            if queued is not None:
                record_start(conn, model=queued.model, org_id=queued.org_id, clock=clock, is_sqlite=self.db.is_sqlite)
            return batch_from_row(taken).claimed_at(clock, local, from_queue=queued is not None)

    def _next_queued(self, conn: Connection, slots: dict[str, int], clock: float) -> Row | None:
        """Per model with a free slot (counted over every worker, under the model's lock): expedited first, then
        fair share by recent service (``store/fair_share.py``; the order: docs/design.md)."""
        for model, model_slots in slots.items():
            self.db.lock_model(conn, model)
            if conn.execute(_RUNNING, {"model": model}).scalar_one() >= model_slots:
                continue
            row = conn.execute(_NEXT_QUEUED, {"model": model, "clock": clock}).first()
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

    def model_shares(self) -> list[Share]:
        """Each organization's share of each model's slots, across every worker (``/metrics``)."""
        with self.db.read() as conn:
            return read_shares(conn)

    def renew_lease(self, batch_id: str, worker_id: str, lease_seconds: float) -> Batch | None:
        """Extend our lease and read the batch back; None when another worker holds it now."""
        with self.db.write() as conn:
            done = conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                                .values(lease_expires_at=self.db.clock(conn) + lease_seconds))
            if done.rowcount == 0:
                return None
            return batch_from_row(conn.execute(sa.select(batches).where(batches.c.id == batch_id)).one())

    def set_concurrency_limit(self, batch_id: str, worker_id: str, limit: int | None,
                              yielding: bool = False) -> None:
        """Record the concurrency limit this worker runs the batch at now and whether it yields to others'
        requests on the engine (the progress object shows both). Fenced by the lease: a worker that lost it writes
        nothing, and is not told (its run ends on the next renewal)."""
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                         .values(concurrency_limit=limit, yielding=yielding))

    def retry_later(self, batch_id: str, worker_id: str, *, failures: int, delay: float) -> None:
        """A run failed for a reason of its own: count it, and give the batch back to the queue (its slot freed)
        until ``delay`` seconds from now."""
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                         .values(lease_owner=None, lease_expires_at=None, started=False, run_failures=failures,
                                 retry_at=self.db.clock(conn) + delay))

    def release(self, batch_id: str, worker_id: str) -> None:
        """Give up the lease (a worker that drains)."""
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                         .values(lease_owner=None, lease_expires_at=None))

    def mark_running(self, batch_id: str, worker_id: str, concurrency_limit: int | None) -> None:
        """The first request is about to start: the queue wait ends here (``in_progress_at``, set once), and the
        row shows the concurrency the run starts at (as ``set_concurrency_limit`` keeps it), in one write. Fenced
        by the lease; a row that would not change is not written."""
        with self.db.write() as conn:
            conn.execute(_MARK_RUNNING, {"batch_id": batch_id, "owner": worker_id, "limit": concurrency_limit,
                                         "stamp": now()})

    def end_run(self, batch_id: str, worker_id: str, *, may_complete: bool) -> Batch:
        """The batch as its run ends (its last chunk committed), read in one write that, when ``may_complete``
        (no early abort stopped it) and every record has its line, moves it on to ``finalizing`` under this
        worker's lease: a crash from there resumes it as a batch to finalize, which needs no slot."""
        with self.db.write() as conn:
            return end_run(conn, batch_id, worker_id, may_complete=may_complete)


# The claim's statements, built once (a claim runs at every tick and after every batch's end): their values are
# bound parameters, the database's clock (``clock``, and ``clock_s`` in whole seconds) among them.
_c = batches.c
_CLOCK = sa.bindparam("clock", type_=sa.Float)
_PROMOTE = batches.update().where(_c.status.in_(QUEUE.source_values)).values(status=QUEUE.to.value)
_FREE = sa.or_(_c.lease_owner.is_(None), _c.lease_expires_at < _CLOCK)
_READY = sa.or_(_c.retry_at.is_(None), _c.retry_at <= _CLOCK)  # not waiting out the backoff after a failed run
_TAKE = (batches.update().where(_c.id == sa.bindparam("batch_id"), _FREE)
         .values(lease_owner=sa.bindparam("owner"), lease_expires_at=sa.bindparam("until"), started=True)
         .returning(*batches.c))
_BY_ID = sa.select(batches).where(_c.id == sa.bindparam("batch_id"))
_MINE = sa.and_(_c.id == sa.bindparam("batch_id"), _c.lease_owner == sa.bindparam("owner"))
_LIMIT = sa.bindparam("limit", type_=sa.Integer)
_MARK_RUNNING = batches.update().where(_MINE, sa.or_(_c.in_progress_at.is_(None),
                                                     _c.concurrency_limit.is_distinct_from(_LIMIT))).values(
    in_progress_at=sa.func.coalesce(_c.in_progress_at, sa.bindparam("stamp")), concurrency_limit=_LIMIT)
_FINALIZING_WHEN_DONE = batches.update().where(
    _MINE, _c.status.in_(ALL_LINED.source_values), _c.total - _c.completed - _c.failed == 0,
).values(status=ALL_LINED.to.value, finalizing_at=sa.bindparam("stamp"))
_RUNNING = sa.select(sa.func.count()).where(_c.model == sa.bindparam("model"), _c.started.is_(True),
                                           _c.status.in_(CLAIMABLE_VALUES))


def _next_queued_query() -> sa.Select:
    source, fair_order = fair_queue()
    return (sa.select(_c.id, _c.model, _c.org_id).select_from(source)
            .where(_c.model == sa.bindparam("model"), _c.started.is_(False),
                   _c.status == BatchStatus.IN_PROGRESS.value, _READY)
            .order_by(sa.case((_c.priority == "expedited", 0), else_=1), *fair_order).limit(1))


_NEXT_QUEUED = _next_queued_query()


@functools.cache
def _to_end(*, runs: bool, some_models: bool) -> sa.Select:
    """The claim's first look, a batch that needs no slot: one being cancelled or finalized, past its window or
    whose model left the catalog; one started whose lease lapsed only when the worker ``runs`` more, of the
    ``start_models`` when it names ``some_models``."""
    to_end = [_c.status != BatchStatus.IN_PROGRESS.value, _c.expires_at <= sa.bindparam("clock_s"),
              _c.model.not_in(sa.bindparam("models", expanding=True))]
    orphaned: sa.ColumnElement[bool] = _c.started.is_(True)
    if some_models:
        orphaned = sa.and_(orphaned, _c.model.in_(sa.bindparam("start_models", expanding=True)))
    return (sa.select(_c.id).where(_c.status.in_(CLAIMABLE_VALUES), _FREE,
                                   _c.id.not_in(sa.bindparam("busy", expanding=True)), _READY,
                                   sa.or_(*to_end, *([orphaned] if runs else [])))
            .order_by(_c.created_ns).limit(1).with_for_update(skip_locked=True))


def end_run(conn: Connection, batch_id: str, worker_id: str, *, may_complete: bool) -> Batch:
    """``BatchLeases.end_run`` in the caller's transaction (also a run's last chunk's: ``Results.commit_chunk``)."""
    if may_complete:
        conn.execute(_FINALIZING_WHEN_DONE, {"batch_id": batch_id, "owner": worker_id, "stamp": now()})
    row = conn.execute(_BY_ID, {"batch_id": batch_id}).first()
    if row is None:
        raise no_such("Batch", batch_id)
    return batch_from_row(row)
