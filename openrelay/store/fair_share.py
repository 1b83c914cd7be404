"""Fair share of a model's slots between organizations, by recent service (docs/design.md, "The queue"): the turns
kept in ``model_shares``, written by the claim that starts a queued batch, under the model's lock."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..types import CLAIMABLE_VALUES, BatchStatus
from .schema import batches, model_shares, organizations

__all__ = ["Share", "NEVER_STARTED", "fair_queue", "record_start", "read_shares"]

# The turn of an organization that never started a batch of the model: before every clock reading.
NEVER_STARTED = 0.0


def fair_queue() -> tuple[sa.FromClause, list[sa.ColumnElement]]:
    """The queued rows' source (``batches`` joined to each organization's running count and turn) and the ORDER
    BY terms, within a tier, for the model bound as the parameter ``model``. The running counts are one aggregate
    over the model's running batches (at most its slots), joined by organization: a count per queued row would read
    every batch of the model in progress once per queued batch: 5.6 s a claim on PostgreSQL with 10,000 queued
    (bench/bench_claim_queue.py)."""
    model: sa.BindParameter[str] = sa.bindparam("model")
    running = (sa.select(batches.c.org_id, sa.func.count().label("batches"))
               .where(batches.c.model == model, batches.c.started.is_(True), batches.c.status.in_(CLAIMABLE_VALUES))
               .group_by(batches.c.org_id).subquery("running_of_org"))
    turns = (sa.select(model_shares.c.org_id, model_shares.c.last_started_at)
             .where(model_shares.c.model == model).subquery("turns"))
    source = (batches.outerjoin(running, running.c.org_id == batches.c.org_id)
              .outerjoin(turns, turns.c.org_id == batches.c.org_id))
    return source, [sa.func.coalesce(running.c.batches, 0), sa.func.coalesce(turns.c.last_started_at, NEVER_STARTED),
                    batches.c.created_ns]


def record_start(conn: Connection, *, model: str, org_id: str, clock: float, is_sqlite: bool) -> None:
    """A queued batch of ``org_id`` starts now (the database's ``clock``): its organization's turn moves to the back."""
    conn.execute(_record_start(is_sqlite), {"model": model, "org_id": org_id, "clock": clock})


@functools.cache
def _record_start(is_sqlite: bool) -> sa.Insert:
    clock = sa.bindparam("clock", type_=sa.Float)
    insert = (sqlite if is_sqlite else postgresql).insert(model_shares)
    return (insert.values(model=sa.bindparam("model"), org_id=sa.bindparam("org_id"), last_started_at=clock,
                          batches_started=1)
            .on_conflict_do_update(index_elements=["model", "org_id"], set_={
                "last_started_at": clock, "batches_started": model_shares.c.batches_started + 1}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Share:
    """One organization's share of one model, across every worker: what ``/metrics`` shows."""

    model: str
    organization: str  # its name
    running: int  # batches of the model it has running now (a slot each)
    queued: int
    batches_started: int  # since the store began keeping turns (migration 0015)
    last_started_at: float | None  # the database's clock; None if it never started one


def read_shares(conn: Connection) -> list[Share]:
    """Every organization with a live batch of a model or a turn kept for it, per model."""
    live = (sa.select(batches.c.model, batches.c.org_id,
                      sa.func.sum(sa.case((batches.c.started.is_(True), 1), else_=0)).label("running"),
                      sa.func.sum(sa.case((sa.and_(batches.c.started.is_(False),
                                                   batches.c.status == BatchStatus.IN_PROGRESS.value), 1),
                                          else_=0)).label("queued"))
            .where(batches.c.status.in_(CLAIMABLE_VALUES)).group_by(batches.c.model, batches.c.org_id))
    counts = {(row.model, row.org_id): (int(row.running), int(row.queued)) for row in conn.execute(live)}
    turns = {(row.model, row.org_id): (row.batches_started, row.last_started_at)
             for row in conn.execute(sa.select(model_shares))}
    names = dict(conn.execute(sa.select(organizations.c.id, organizations.c.name).where(
        organizations.c.id.in_({org for _, org in counts.keys() | turns.keys()}))).all())
    shares = []
    for model, org_id in sorted(counts.keys() | turns.keys()):
        running, queued = counts.get((model, org_id), (0, 0))
        started, last = turns.get((model, org_id), (0, None))
        shares.append(Share(model=model, organization=names.get(org_id, org_id), running=running, queued=queued,
                            batches_started=started, last_started_at=last))
    return shares
