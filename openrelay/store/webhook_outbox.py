"""The webhook outbox: events, one delivery of each per endpoint, the claims delivery loops take, and what an
attempt's outcome does to its delivery and its endpoint.

An event is written (``enqueue_batch_event``) in the transaction that gives a batch its terminal status, so a crash
can neither lose an event nor make one up. Loops on any machine share deliveries through ``claim_due`` (each
endpoint with its own concurrency and circuit); ``record_attempt`` is fenced by the claim's token. At least once,
never lost: docs/webhooks.md, "Delivery". Every time here is the database's clock."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..backoff import Backoff
from ..clock import now
from ..ids import new_claim_token, new_event_id, new_webhook_attempt_id
from ..types import BatchStatus
from .db import Database
from .schema import webhook_attempts, webhook_deliveries, webhook_endpoints, webhook_events

__all__ = ["WebhookOutbox", "DueDelivery", "EVENT_TYPES", "TEST_EVENT_TYPE", "PENDING", "DELIVERED",
           "FAILED", "REMOVED", "enqueue_batch_event", "end_pending_deliveries", "event_payload", "delivery_id",
           "subscribed"]

# The event each terminal status sends (OpenAI's batch webhook events).
EVENT_TYPES = {
    BatchStatus.COMPLETED: "batch.completed",
    BatchStatus.FAILED: "batch.failed",
    BatchStatus.EXPIRED: "batch.expired",
    BatchStatus.CANCELLED: "batch.cancelled",
}
TEST_EVENT_TYPE = "webhook.test"  # `orl admin webhook test`: data.id is the endpoint's id

# A delivery's state (webhook_deliveries.state).
PENDING, DELIVERED, FAILED, REMOVED = "pending", "delivered", "failed", "removed"


@dataclass(frozen=True, kw_only=True)
class DueDelivery:
    """A delivery claimed by one loop: everything needed to send it and to record the outcome."""

    event_id: str
    endpoint_id: str
    delivery_id: str
    org_id: str
    url: str
    secret: str
    previous_secret: str | None  # a rotation's replaced secret, while it still signs too
    payload: bytes
    attempt: int  # this attempt's number, 1 for the first
    enqueued_at: float
    claim_token: str

    @property
    def signing_secrets(self) -> list[str]:
        return [self.secret] if self.previous_secret is None else [self.secret, self.previous_secret]


def event_payload(event_id: str, event_type: str, created_at: int, object_id: str,
                  errors: list[dict[str, Any]] | None = None) -> bytes:
    """The body of an event, as OpenAI's webhooks shape it; a ``batch.failed`` one also says why (``errors``, as
    the batch object shows them)."""
    data: dict[str, Any] = {"id": object_id}
    if errors:
        data["errors"] = {"object": "list", "data": errors}
    return orjson.dumps({"id": event_id, "object": "event", "type": event_type, "created_at": created_at,
                         "data": data})


def delivery_id(event_id: sa.ColumnElement[str], endpoint_id: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
    """A delivery's id, made of its event's and endpoint's (unique as that pair is): ``whd_`` + the event's hex +
    the endpoint's. Migration 0018 gave the deliveries before it the same."""
    return sa.literal("whd_", sa.String) + sa.func.substr(event_id, 5) + sa.func.substr(endpoint_id, 4)


def subscribed(event_type: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    """Whether an endpoint gets events of ``event_type``: it names no types (every one), or names this one."""
    events = webhook_endpoints.c.events
    comma = sa.literal(",", sa.String)
    return sa.or_(events.is_(None), (comma + events + comma).contains(comma + event_type + comma))


def previous_secret_in_force(previous_secret: str | None, rotated_at: float | None, clock: float,
                             overlap: float) -> str | None:
    """The secret a rotation replaced while it still signs (``overlap`` seconds after the rotation), else None."""
    if previous_secret is None or rotated_at is None or clock >= rotated_at + overlap:
        return None
    return previous_secret


def _insert_event(conn: Connection, *, clock: float, org_id: str, event_type: str, batch_id: str | None,
                  object_id: str, stamp: int, endpoint_id: str | None = None,
                  errors: list[dict[str, Any]] | None = None) -> str:
    """The event and a pending delivery, due now, to each live endpoint of the organization subscribed to
    ``event_type`` (or only to ``endpoint_id``, whatever it subscribes to)."""
    event_id = new_event_id()
    conn.execute(webhook_events.insert(), {
        "id": event_id, "org_id": org_id, "type": event_type, "batch_id": batch_id, "created_at": stamp,
        "payload": event_payload(event_id, event_type, stamp, object_id, errors).decode()})
    conn.execute(_deliveries_insert(to_one_endpoint=endpoint_id is not None), {
        "event_id": event_id, "clock": clock, "org_id": org_id, "endpoint_id": endpoint_id, "event_type": event_type})
    return event_id


@functools.cache
def _deliveries_insert(*, to_one_endpoint: bool) -> sa.Insert:
    """``_insert_event``'s deliveries, built once (every batch's end runs it), its values as parameters."""
    e = webhook_endpoints.c
    clock = sa.bindparam("clock", type_=sa.Float)
    event_id = sa.bindparam("event_id", type_=sa.String)
    targets = sa.select(delivery_id(event_id, e.id), event_id, e.id, e.org_id, sa.literal(PENDING, sa.String),
                        sa.literal(0), clock, clock, clock).where(e.org_id == sa.bindparam("org_id"),
                                                                 e.removed_at.is_(None))
    if to_one_endpoint:
        targets = targets.where(e.id == sa.bindparam("endpoint_id"))
    else:
        targets = targets.where(subscribed(sa.bindparam("event_type", type_=sa.String)))
    d = webhook_deliveries.c
    return webhook_deliveries.insert().from_select(
        [d.id, d.event_id, d.endpoint_id, d.org_id, d.state, d.attempts, d.enqueued_at, d.next_attempt_at,
         d.created_at], targets)


def enqueue_batch_event(conn: Connection, *, clock: float, org_id: str, batch_id: str, status: BatchStatus,
                        stamp: int, errors: list[dict[str, Any]] | None = None) -> str:
    """Called inside the transaction that writes the terminal ``status``; returns the event's id. ``errors``: a
    failed batch's, which its event carries."""
    return _insert_event(conn, clock=clock, org_id=org_id, event_type=EVENT_TYPES[status], batch_id=batch_id,
                         object_id=batch_id, stamp=stamp, errors=errors if status is BatchStatus.FAILED else None)


def end_pending_deliveries(conn: Connection, endpoint_id: str) -> None:
    """Called inside the transaction that removes the endpoint: its pending deliveries end (``removed``)."""
    d = webhook_deliveries.c
    conn.execute(webhook_deliveries.update().where(d.endpoint_id == endpoint_id, d.state == PENDING)
                 .values(state=REMOVED, claim_token=None))


class WebhookOutbox:
    def __init__(self, db: Database) -> None:
        self.db = db

    def enqueue_test_event(self, endpoint_id: str, *, hold_seconds: float, rotation_overlap: float = 0.0,
                           ) -> DueDelivery:
        """A test event for one endpoint (found live by the caller), its delivery already claimed by the caller,
        who sends it (so no delivery loop takes it first)."""
        d, e = webhook_deliveries.c, webhook_endpoints.c
        token = new_claim_token()
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            endpoint = conn.execute(sa.select(e.org_id, e.url, e.secret, e.previous_secret, e.rotated_at)
                                    .where(e.id == endpoint_id)).one()
            event_id = _insert_event(conn, clock=clock, org_id=endpoint.org_id, event_type=TEST_EVENT_TYPE,
                                     batch_id=None, object_id=endpoint_id, stamp=now(), endpoint_id=endpoint_id)
            conn.execute(webhook_deliveries.update().where(d.event_id == event_id, d.endpoint_id == endpoint_id)
                         .values(next_attempt_at=clock + hold_seconds, claim_token=token))
            payload = conn.execute(sa.select(webhook_events.c.payload).where(webhook_events.c.id == event_id)
                                   ).scalar_one()
            written_id = conn.execute(sa.select(d.id).where(d.event_id == event_id)).scalar_one()
        previous = previous_secret_in_force(endpoint.previous_secret, endpoint.rotated_at, clock, rotation_overlap)
        return DueDelivery(event_id=event_id, endpoint_id=endpoint_id, delivery_id=written_id,
                           org_id=endpoint.org_id, url=endpoint.url, secret=endpoint.secret,
                           previous_secret=previous, payload=payload.encode(), attempt=1, enqueued_at=clock,
                           claim_token=token)

    def claim_due(self, *, limit: int, hold_seconds: float, endpoint_concurrency: int,
                  rotation_overlap: float = 0.0) -> list[DueDelivery]:
        """Up to ``limit`` pending deliveries due now, each taken for ``hold_seconds``: no other loop takes it
        meanwhile, and after that it is due again unless its outcome was recorded. An endpoint gets them only while
        it is not paused (``record_attempt``), up to ``endpoint_concurrency`` attempts in flight (one while it is
        failing), and in turns with the others, the least busy first, so that no endpoint waits behind another's
        backlog. Each is signed by its endpoint's secret, and by the one a rotation replaced less than
        ``rotation_overlap`` seconds ago."""
        d, e, ev = webhook_deliveries.c, webhook_endpoints.c, webhook_events.c
        with self.db.read() as conn:  # most polls find nothing: a read, not a write lock (SQLite has one)
            if conn.execute(_claimable(self.db.clock(conn), endpoint_concurrency).limit(1)).first() is None:
                return []
        token = new_claim_token()
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            # PostgreSQL: a racing loop skips the endpoints locked here; one that read before this commits finds the
            # deliveries taken here no longer due below, so no endpoint passes its concurrency.
            rows = conn.execute(_claimable(clock, endpoint_concurrency).limit(limit).with_for_update(
                of=webhook_endpoints, skip_locked=True, key_share=True)).all()
            due = sa.and_(d.state == PENDING, d.next_attempt_at <= clock)
            claimed: list[DueDelivery] = []
            for row in rows:
                taken = conn.execute(webhook_deliveries.update().where(
                    d.event_id == row.event_id, d.endpoint_id == row.endpoint_id, due,
                ).values(next_attempt_at=clock + hold_seconds, claim_token=token))
                if taken.rowcount != 1:
                    continue
                full = conn.execute(
                    sa.select(d.attempts, d.enqueued_at, e.url, e.secret, ev.payload, d.org_id, d.id,
                              e.previous_secret, e.rotated_at)
                    .select_from(webhook_deliveries.join(webhook_endpoints, e.id == d.endpoint_id)
                                 .join(webhook_events, ev.id == d.event_id))
                    .where(d.event_id == row.event_id, d.endpoint_id == row.endpoint_id)).one()
                previous = previous_secret_in_force(full.previous_secret, full.rotated_at, clock,
                                                    rotation_overlap)
                claimed.append(DueDelivery(event_id=row.event_id, endpoint_id=row.endpoint_id, delivery_id=full.id,
                                           org_id=full.org_id, url=full.url, secret=full.secret,
                                           previous_secret=previous, payload=full.payload.encode(),
                                           attempt=full.attempts + 1, enqueued_at=full.enqueued_at,
                                           claim_token=token))
        return claimed

    def record_attempt(self, due: DueDelivery, *, outcome: str, status_code: int | None, error: str | None,
                       duration_ms: int, backoff: Backoff, give_up_after: float, retry: bool = True) -> str:
        """Log the attempt and move its delivery and its endpoint on. Delivered: the endpoint's failures are
        forgiven and its pause ends. Otherwise the delivery is due again after ``backoff`` of its attempts, or
        ``failed`` when that would be later than ``give_up_after`` seconds after it was enqueued (or not
        ``retry``), and its endpoint pauses (``_pause_endpoint``). Returns the delivery's state. A claim that is
        no longer ours (its hold lapsed and another loop took it) changes nothing but the log."""
        d, e = webhook_deliveries.c, webhook_endpoints.c
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            conn.execute(webhook_attempts.insert().values(
                id=new_webhook_attempt_id(), event_id=due.event_id, endpoint_id=due.endpoint_id,
                org_id=due.org_id, attempt=due.attempt, attempted_at=clock, outcome=outcome,
                status_code=status_code, error=error, duration_ms=duration_ms))
            values: dict[str, Any] = {"attempts": due.attempt, "last_attempt_at": clock, "claim_token": None}
            retry_at = clock + backoff.delay(due.attempt)
            if outcome == DELIVERED:
                values.update(state=DELIVERED, delivered_at=clock)
            elif not retry or retry_at > due.enqueued_at + give_up_after:
                values.update(state=FAILED)
            else:
                values.update(next_attempt_at=retry_at)
            done = conn.execute(webhook_deliveries.update().where(
                d.event_id == due.event_id, d.endpoint_id == due.endpoint_id, d.claim_token == due.claim_token,
                d.state == PENDING).values(**values))
            if done.rowcount != 1:
                return str(conn.execute(sa.select(d.state).where(d.event_id == due.event_id,
                                                                 d.endpoint_id == due.endpoint_id)).scalar_one())
            if outcome == DELIVERED:
                conn.execute(webhook_endpoints.update().where(
                    e.id == due.endpoint_id, sa.or_(e.failures != 0, e.paused_until.is_not(None)))
                    .values(failures=0, paused_until=None))
            else:
                _pause_endpoint(conn, due.endpoint_id, clock=clock, backoff=backoff, give_up_after=give_up_after)
            return str(values.get("state", PENDING))


def _claimable(clock: float, endpoint_concurrency: int) -> sa.Select:
    """The due deliveries each endpoint may have attempted now (``claim_due``), longest due first, in turns: every
    endpoint's first before any second, the least busy endpoints first."""
    d, e = webhook_deliveries.c, webhook_endpoints.c
    place = sa.func.row_number().over(partition_by=d.endpoint_id, order_by=(d.next_attempt_at, d.event_id))
    heads = (sa.select(d.event_id, d.endpoint_id, d.next_attempt_at, place.label("place"))
             .where(d.state == PENDING, d.next_attempt_at <= clock).subquery())
    flying = (sa.select(d.endpoint_id, sa.func.count().label("count"))
              .where(d.state == PENDING, d.claim_token.is_not(None), d.next_attempt_at > clock)
              .group_by(d.endpoint_id).subquery())
    busy = sa.func.coalesce(flying.c.count, 0)
    return (sa.select(heads.c.event_id, heads.c.endpoint_id)
            .select_from(heads.join(webhook_endpoints, e.id == heads.c.endpoint_id)
                         .outerjoin(flying, flying.c.endpoint_id == heads.c.endpoint_id))
            .where(sa.or_(e.paused_until.is_(None), e.paused_until <= clock),
                   busy + heads.c.place <= sa.case((e.failures == 0, endpoint_concurrency), else_=1))
            .order_by(busy + heads.c.place, heads.c.next_attempt_at))


def _pause_endpoint(conn: Connection, endpoint_id: str, *, clock: float, backoff: Backoff,
                    give_up_after: float) -> None:
    """The endpoint's circuit after a failed attempt: no attempt to it for ``backoff`` of its failures in a row
    (then one at a time until one is delivered). Its deliveries due before then wait for the pause, and those
    whose window would end first are given up, as their own failure would give them up."""
    d, e = webhook_deliveries.c, webhook_endpoints.c
    failures = conn.execute(webhook_endpoints.update().where(e.id == endpoint_id)
                            .values(failures=e.failures + 1).returning(e.failures)).scalar_one()
    until = clock + backoff.delay(failures)
    conn.execute(webhook_endpoints.update().where(e.id == endpoint_id).values(paused_until=until))
    waiting = sa.and_(d.endpoint_id == endpoint_id, d.state == PENDING, d.claim_token.is_(None),
                      d.next_attempt_at < until)
    conn.execute(webhook_deliveries.update().where(waiting, d.enqueued_at + give_up_after < until)
                 .values(state=FAILED))
    conn.execute(webhook_deliveries.update().where(waiting).values(next_attempt_at=until))
