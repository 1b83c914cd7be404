"""The live worker processes: each registers and renews its row as it goes (a heartbeat); the number alive sets
each one's share of a model's slots (``worker/share.py``); ``orl admin workers`` lists them. Every time here is
the database's clock, so workers on machines whose clocks disagree still agree on who is gone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from ..types import CLAIMABLE_VALUES
from .db import Database
from .schema import batches, workers

__all__ = ["WorkerRegistry", "WorkerSeen"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSeen:
    """One live worker, as ``orl admin workers`` shows it."""

    id: str
    host: str
    pid: int
    version: str
    models: list[str]  # the models its catalog serves
    batches_held: int  # batches whose lease it holds now (running, or being ended)
    started_at: float  # the database's clock
    last_seen_at: float  # its last heartbeat, the database's clock


class WorkerRegistry:
    def __init__(self, db: Database) -> None:
        self.db = db

    def heartbeat(self, worker_id: str, *, host: str, pid: int, version: str, models: Collection[str],
                  lease_seconds: float) -> dict[str, int]:
        """Register or renew ``worker_id`` (serving ``models``) until ``lease_seconds`` from now; delete the
        workers gone past their lease; return, per model, how many live workers serve it (this one included)."""
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            seen = {"last_seen_at": clock, "expires_at": clock + lease_seconds}
            insert = (sqlite if self.db.is_sqlite else postgresql).insert(workers)
            conn.execute(insert.values(id=worker_id, host=host[:255], pid=pid, version=version[:40],
                                       models="\n".join(sorted(models)), started_at=clock, **seen)
                         .on_conflict_do_update(index_elements=["id"], set_=seen))
            conn.execute(workers.delete().where(workers.c.expires_at < clock))
            served = conn.execute(sa.select(workers.c.models)).scalars()
            return Counter(model for lines in served for model in lines.split("\n") if model)

    def leave(self, worker_id: str) -> None:
        """A clean stop: the worker no longer counts at once, so the others' shares grow on their next beat."""
        with self.db.write() as conn:
            conn.execute(workers.delete().where(workers.c.id == worker_id))

    def live(self) -> list[WorkerSeen]:
        """The workers not past their lease, oldest first, each with the batches it holds."""
        with self.db.read() as conn:
            clock = self.db.clock(conn)
            held = (sa.select(sa.func.count()).where(
                batches.c.lease_owner == workers.c.id, batches.c.lease_expires_at >= clock,
                batches.c.status.in_(CLAIMABLE_VALUES)).scalar_subquery())
            rows = conn.execute(sa.select(workers, held.label("held")).where(workers.c.expires_at >= clock)
                                .order_by(workers.c.started_at, workers.c.id)).all()
        return [WorkerSeen(id=row.id, host=row.host, pid=row.pid, version=row.version,
                           models=[m for m in row.models.split("\n") if m], batches_held=row.held,
                           started_at=row.started_at, last_seen_at=row.last_seen_at) for row in rows]
