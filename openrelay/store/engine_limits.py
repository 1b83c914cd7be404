"""What the adaptive concurrency limiters learnt, per model and engine replica: the limit and the baseline latency
each ran at last, so that a worker starting (on this machine or another) begins there rather than at
``min_concurrency``. The last worker to write wins; each keeps adapting from where it starts."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from ..clock import now
from .db import Database
from .schema import engine_limits

__all__ = ["EngineLimits", "Learnt"]


@dataclass(frozen=True)
class Learnt:
    limit: int
    baseline_seconds: float  # a typical call's latency at the bottom of the limit, as the limiter measured it


class EngineLimits:
    def __init__(self, db: Database) -> None:
        self.db = db

    def learnt(self, model: str) -> dict[str, Learnt]:
        """The model's replicas (by name) with a learnt limit."""
        with self.db.read() as conn:
            rows = conn.execute(sa.select(engine_limits.c.replica, engine_limits.c.concurrency_limit,
                                          engine_limits.c.baseline_seconds).where(engine_limits.c.model == model))
            return {row.replica: Learnt(row.concurrency_limit, row.baseline_seconds) for row in rows}

    def save(self, model: str, learnt: dict[str, Learnt]) -> None:
        """Keep what the model's replicas (by name) learnt, in one transaction."""
        if not learnt:
            return
        dialect = sqlite if self.db.is_sqlite else postgresql
        stamp = now()
        with self.db.write() as conn:
            for replica, state in learnt.items():
                values = {"concurrency_limit": state.limit, "baseline_seconds": state.baseline_seconds,
                          "updated_at": stamp}
                conn.execute(dialect.insert(engine_limits).values(model=model, replica=replica, **values)
                             .on_conflict_do_update(index_elements=["model", "replica"], set_=values))
