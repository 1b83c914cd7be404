"""The webhook deliveries an organization or an operator looks at and acts on after the fact: an endpoint's
deliveries, the log of attempts, a replay (the delivery back in the outbox, due now, in one transaction: durable
before anything is sent; docs/webhooks.md, "Replay a delivery"), and pruning the log past its age."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..errors import Conflict, NotFound
from .db import Database, holds_nul
from .schema import webhook_attempts, webhook_deliveries, webhook_endpoints, webhook_events
from .webhook_outbox import PENDING

__all__ = ["WebhookLog", "DeliveryView", "ReplayedDelivery", "AttemptLog", "PrunedLog"]

_PRUNE_ROWS = 1000  # deliveries (with their attempts) or events one pruning transaction deletes at most


def _seconds(clock: float | None) -> int | None:
    return None if clock is None else int(clock)


@dataclass(frozen=True, kw_only=True)
class DeliveryView:
    id: str
    event_id: str
    event_type: str
    batch_id: str | None
    created_at: int  # the event's
    state: str
    attempts: int
    last_attempt_at: float | None
    delivered_at: float | None
    next_attempt_at: float | None  # only while pending

    def as_api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "webhook_delivery", "event_id": self.event_id, "type": self.event_type,
                "batch_id": self.batch_id, "created_at": self.created_at, "state": self.state,
                "attempts": self.attempts, "last_attempt_at": _seconds(self.last_attempt_at),
                "delivered_at": _seconds(self.delivered_at), "next_attempt_at": _seconds(self.next_attempt_at)}


@dataclass(frozen=True, kw_only=True)
class ReplayedDelivery:
    id: str
    event_id: str
    endpoint_id: str
    attempts: int  # made so far: the replay is attempt ``attempts + 1``
    previous_state: str  # what it was before the replay: delivered, failed, pending

    def as_api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "webhook_delivery", "event_id": self.event_id,
                "endpoint_id": self.endpoint_id, "state": PENDING, "previous_state": self.previous_state,
                "attempts": self.attempts}


@dataclass(frozen=True, kw_only=True)
class AttemptLog:
    event_id: str
    event_type: str
    batch_id: str | None
    endpoint_id: str
    org_id: str
    url: str
    attempt: int
    attempted_at: float
    outcome: str
    status_code: int | None
    error: str | None
    duration_ms: int
    state: str  # the delivery's state now
    delivery_id: str

    def as_json(self) -> dict[str, Any]:
        return {"delivery_id": self.delivery_id, "event_id": self.event_id, "type": self.event_type,
                "batch_id": self.batch_id, "endpoint_id": self.endpoint_id, "org_id": self.org_id, "url": self.url,
                "attempt": self.attempt,
                "attempted_at": round(self.attempted_at, 3), "outcome": self.outcome,
                "status_code": self.status_code, "error": self.error, "duration_ms": self.duration_ms,
                "delivery_state": self.state}


@dataclass(frozen=True, kw_only=True)
class PrunedLog:
    attempts: int
    deliveries: int
    events: int


class WebhookLog:
    def __init__(self, db: Database) -> None:
        self.db = db

    def list_deliveries(self, endpoint_id: str, *, limit: int, after: str | None = None,
                        ) -> tuple[list[DeliveryView], bool]:
        """An endpoint's deliveries (the caller found it the organization's), newest first (as written, which a
        replay does not change), after the delivery ``after``; and whether there are more."""
        d, ev = webhook_deliveries.c, webhook_events.c
        newest_first = (d.created_at.desc(), d.id.desc())
        query = (sa.select(d.id, d.event_id, ev.type, ev.batch_id, ev.created_at, d.state, d.attempts,
                           d.last_attempt_at, d.delivered_at, d.next_attempt_at)
                 .select_from(webhook_deliveries.join(webhook_events, ev.id == d.event_id))
                 .where(d.endpoint_id == endpoint_id).order_by(*newest_first).limit(limit + 1))
        with self.db.read() as conn:
            if after is not None:
                mark = None if holds_nul(after) else conn.execute(
                    sa.select(d.created_at, d.id).where(d.id == after, d.endpoint_id == endpoint_id)).first()
                if mark is None:
                    raise NotFound(f"No such webhook delivery: {after[:64]}", param="after")
                query = query.where(sa.or_(d.created_at < mark.created_at, sa.and_(
                    d.created_at == mark.created_at, d.id < mark.id)))
            rows = conn.execute(query).all()
        views = [DeliveryView(id=r.id, event_id=r.event_id, event_type=r.type, batch_id=r.batch_id,
                              created_at=r.created_at, state=r.state, attempts=r.attempts,
                              last_attempt_at=r.last_attempt_at, delivered_at=r.delivered_at,
                              next_attempt_at=r.next_attempt_at if r.state == PENDING else None)
                 for r in rows[:limit]]
        return views, len(rows) > limit

    def replay_delivery(self, delivery_id: str, org_id: str | None = None) -> ReplayedDelivery:
        """Due again now, whatever became of it (delivered, given up, still retrying), as a new attempt, with a
        fresh retry window; a claim in flight is dropped, so that attempt's outcome no longer decides its state.
        A paused endpoint's pause ends: the replay is the one attempt its circuit lets through.
        404 for an unknown id (or another organization's); 409 when its endpoint was removed."""
        d, e = webhook_deliveries.c, webhook_endpoints.c
        with self.db.write() as conn:
            row = None
            if not holds_nul(delivery_id):
                query = (sa.select(d.event_id, d.endpoint_id, d.state, d.attempts, e.removed_at)
                         .select_from(webhook_deliveries.join(webhook_endpoints, e.id == d.endpoint_id))
                         .where(d.id == delivery_id))
                if org_id is not None:
                    query = query.where(d.org_id == org_id)
                row = conn.execute(query).first()
            if row is None:
                raise NotFound(f"No such webhook delivery: {delivery_id}", param="delivery_id")
            if row.removed_at is not None:
                raise Conflict(f"webhook delivery {delivery_id} cannot be replayed: its endpoint {row.endpoint_id} "
                               "was removed", code="webhook_endpoint_removed", param="delivery_id")
            clock = self.db.clock(conn)
            conn.execute(webhook_deliveries.update().where(d.id == delivery_id).values(
                state=PENDING, next_attempt_at=clock, enqueued_at=clock, claim_token=None))
            conn.execute(webhook_endpoints.update().where(e.id == row.endpoint_id).values(paused_until=None))
        return ReplayedDelivery(id=delivery_id, event_id=row.event_id, endpoint_id=row.endpoint_id,
                                attempts=row.attempts, previous_state=row.state)

    def prune_delivery_log(self, *, older_than: float, rows_per_transaction: int = _PRUNE_ROWS) -> PrunedLog:
        """Delete what is over and older than ``older_than`` seconds: each delivery no longer pending whose last
        attempt (or enqueueing) is that old, with its attempts, then each event that old left without a delivery.
        A pending delivery and its event stay, however old. Short transactions of ``rows_per_transaction``
        deliveries or events each, so that a long log does not hold SQLite's one write lock for long."""
        a, d, ev = webhook_attempts.c, webhook_deliveries.c, webhook_events.c
        with self.db.read() as conn:
            cutoff = self.db.clock(conn) - older_than
        attempts = deliveries = events = 0
        finished = sa.and_(d.state != PENDING, sa.func.coalesce(d.last_attempt_at, d.enqueued_at) < cutoff)
        while True:
            with self.db.write() as conn:
                keys = [{"event": k.event_id, "endpoint": k.endpoint_id} for k in conn.execute(
                    sa.select(d.event_id, d.endpoint_id).where(finished).limit(rows_per_transaction)).all()]
                if keys:  # one statement per delivery, on its index (SQLite scans for a (a, b) IN list)
                    attempts += conn.execute(webhook_attempts.delete().where(
                        a.event_id == sa.bindparam("event"), a.endpoint_id == sa.bindparam("endpoint")), keys).rowcount
                    deliveries += conn.execute(webhook_deliveries.delete().where(
                        d.event_id == sa.bindparam("event"), d.endpoint_id == sa.bindparam("endpoint")), keys).rowcount
            if len(keys) < rows_per_transaction:
                break
        while True:
            with self.db.write() as conn:
                ids = list(conn.execute(sa.select(ev.id).where(
                    ev.created_at < cutoff, ~sa.exists().where(d.event_id == ev.id)).limit(rows_per_transaction)
                ).scalars())
                if ids:
                    events += conn.execute(webhook_events.delete().where(ev.id.in_(ids))).rowcount
            if len(ids) < rows_per_transaction:
                break
        return PrunedLog(attempts=attempts, deliveries=deliveries, events=events)

    # -- what the operator reads ----------------------------------------------------------------------------------

    def attempts(self, *, org_id: str | None = None, endpoint_id: str | None = None, event_id: str | None = None,
                 limit: int = 100) -> list[AttemptLog]:
        """The delivery log, newest attempt first."""
        a, ev, e, d = webhook_attempts.c, webhook_events.c, webhook_endpoints.c, webhook_deliveries.c
        query = (sa.select(a.event_id, ev.type, ev.batch_id, a.endpoint_id, a.org_id, e.url, a.attempt,
                           a.attempted_at, a.outcome, a.status_code, a.error, a.duration_ms, d.state, d.id)
                 .select_from(webhook_attempts.join(webhook_events, ev.id == a.event_id)
                              .join(webhook_endpoints, e.id == a.endpoint_id)
                              .join(webhook_deliveries, sa.and_(d.event_id == a.event_id,
                                                                d.endpoint_id == a.endpoint_id)))
                 .order_by(a.attempted_at.desc(), a.attempt.desc()).limit(limit))
        for column, value in ((a.org_id, org_id), (a.endpoint_id, endpoint_id), (a.event_id, event_id)):
            if value is not None:
                query = query.where(column == value)
        with self.db.read() as conn:
            rows = conn.execute(query).all()
        return [AttemptLog(event_id=r[0], event_type=r[1], batch_id=r[2], endpoint_id=r[3], org_id=r[4], url=r[5],
                           attempt=r[6], attempted_at=r[7], outcome=r[8], status_code=r[9], error=r[10],
                           duration_ms=r[11], state=r[12], delivery_id=r[13]) for r in rows]
