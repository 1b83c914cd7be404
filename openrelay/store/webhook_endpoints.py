"""An organization's webhook endpoints: added under a limit (subscribed to every event type or to some), listed,
found, their secret rotated, removed (which ends their pending deliveries in the same transaction,
``store/webhook_outbox.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row

from ..clock import now, now_ns
from ..errors import NotFound
from ..ids import new_webhook_endpoint_id
from .db import Database, holds_nul
from .schema import organizations, webhook_endpoints
from .webhook_outbox import EVENT_TYPES, end_pending_deliveries

__all__ = ["WebhookEndpoints", "WebhookEndpoint", "ALL_EVENT_TYPES"]

ALL_EVENT_TYPES = tuple(EVENT_TYPES.values())  # what an endpoint may subscribe to, in the order shown


@dataclass(frozen=True, kw_only=True)
class WebhookEndpoint:
    id: str
    org_id: str
    url: str
    created_at: int
    removed_at: int | None
    events: tuple[str, ...] | None  # the event types it gets; None: every type, those added later too
    rotated_at: float | None  # its secret's last rotation (the database's clock)

    def as_api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "webhook_endpoint", "url": self.url, "created_at": self.created_at,
                "events": list(ALL_EVENT_TYPES if self.events is None else self.events)}


def _endpoint(row: Row) -> WebhookEndpoint:
    return WebhookEndpoint(id=row.id, org_id=row.org_id, url=row.url, created_at=row.created_at,
                           removed_at=row.removed_at, events=None if row.events is None else
                           tuple(row.events.split(",")), rotated_at=row.rotated_at)


class WebhookEndpoints:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add_endpoint(self, org_id: str, url: str, secret: str, *, limit: int,
                     events: tuple[str, ...] | None = None) -> WebhookEndpoint | None:
        """The new endpoint, subscribed to ``events`` (None: every type), or None when the organization already
        has ``limit`` (checked in the same transaction, so racing adds cannot pass it on PostgreSQL either: the
        organization's row is locked)."""
        e = webhook_endpoints.c
        with self.db.write() as conn:
            conn.execute(sa.select(organizations.c.id).where(organizations.c.id == org_id).with_for_update())
            live = conn.execute(sa.select(sa.func.count()).where(e.org_id == org_id, e.removed_at.is_(None))
                                ).scalar_one()
            if live >= limit:
                return None
            endpoint_id = new_webhook_endpoint_id()
            conn.execute(webhook_endpoints.insert().values(
                id=endpoint_id, org_id=org_id, url=url, secret=secret, created_at=now(), created_ns=now_ns(),
                events=None if events is None else ",".join(events)))
            row = conn.execute(sa.select(webhook_endpoints).where(e.id == endpoint_id)).one()
        return _endpoint(row)

    def list_endpoints(self, org_id: str | None) -> list[WebhookEndpoint]:
        """Live endpoints, oldest first; every organization's when ``org_id`` is None."""
        e = webhook_endpoints.c
        query = sa.select(webhook_endpoints).where(e.removed_at.is_(None)).order_by(e.created_ns, e.id)
        if org_id is not None:
            query = query.where(e.org_id == org_id)
        with self.db.read() as conn:
            return [_endpoint(row) for row in conn.execute(query).all()]

    def endpoint(self, endpoint_id: str, org_id: str | None = None) -> WebhookEndpoint:
        """A live endpoint (of ``org_id`` when given); 404 otherwise, another organization's included."""
        e = webhook_endpoints.c
        row = None
        if not holds_nul(endpoint_id):
            query = sa.select(webhook_endpoints).where(e.id == endpoint_id, e.removed_at.is_(None))
            if org_id is not None:
                query = query.where(e.org_id == org_id)
            with self.db.read() as conn:
                row = conn.execute(query).first()
        if row is None:
            raise NotFound(f"No such webhook endpoint: {endpoint_id}", param="webhook_id")
        return _endpoint(row)

    def rotate_secret(self, endpoint_id: str, secret: str, org_id: str | None = None) -> WebhookEndpoint:
        """``secret`` signs from now on; the one it replaces signs beside it for the overlap after ``rotated_at``
        (``webhook_outbox.previous_secret_in_force``). A rotation during an overlap ends the older secret's."""
        found = self.endpoint(endpoint_id, org_id)
        e = webhook_endpoints.c
        with self.db.write() as conn:
            done = conn.execute(webhook_endpoints.update().where(e.id == found.id, e.removed_at.is_(None))
                                .values(previous_secret=e.secret, secret=secret, rotated_at=self.db.clock(conn)))
            if done.rowcount == 0:
                raise NotFound(f"No such webhook endpoint: {endpoint_id}", param="webhook_id")
            row = conn.execute(sa.select(webhook_endpoints).where(e.id == found.id)).one()
        return _endpoint(row)

    def remove_endpoint(self, endpoint_id: str, org_id: str | None = None) -> WebhookEndpoint:
        """Removed at once: its pending deliveries end (``removed``) in the same transaction; its log stays."""
        found = self.endpoint(endpoint_id, org_id)
        e = webhook_endpoints.c
        with self.db.write() as conn:
            done = conn.execute(webhook_endpoints.update().where(e.id == found.id, e.removed_at.is_(None))
                                .values(removed_at=now()))
            if done.rowcount == 0:
                raise NotFound(f"No such webhook endpoint: {endpoint_id}", param="webhook_id")
            end_pending_deliveries(conn, found.id)
        return found
