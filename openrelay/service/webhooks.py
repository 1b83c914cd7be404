"""Webhook endpoints: what an API key with ``batch.write`` (``/v1/webhooks``) and the operator (``orl admin
webhook``) may register (for every event type or some), list, remove, test, rotate the secret of, and replay a
delivery to. Events themselves are written by the store with each terminal status and sent by the workers
(``openrelay/webhooks``)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..catalog import Catalog
from ..config import Settings
from ..errors import Conflict, InvalidRequest
from ..store.webhook_endpoints import ALL_EVENT_TYPES, WebhookEndpoint, WebhookEndpoints
from ..store.webhook_log import WebhookLog
from ..store.webhook_outbox import WebhookOutbox
from ..types import ApiKey, Scope
from ..webhooks.delivery import Attempt, WebhookDelivery
from ..webhooks.network import normalized, webhook_url_problem
from ..webhooks.signing import new_secret
from .auth import require
from .bodies import json_object, list_page, reject_unrecognized

__all__ = ["MAX_ENDPOINTS", "event_types", "register_endpoint", "send_test_event", "rotate_secret",
           "create_webhook", "list_webhooks", "delete_webhook", "rotate_webhook", "list_webhook_deliveries",
           "replay_webhook_delivery"]

MAX_ENDPOINTS = 16  # per organization: every terminal status writes a delivery to each, in its transaction
_CREATE_FIELDS = {"url", "events"}


def event_types(events: object) -> tuple[str, ...]:
    """The event types an endpoint subscribes to, in ``ALL_EVENT_TYPES``'s order, or the 400 naming ``events``:
    they must be a non-empty list of the types ``ALL_EVENT_TYPES`` names."""
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise InvalidRequest(f"events must be a non-empty list of event types ({', '.join(ALL_EVENT_TYPES)})",
                             param="events")
    unknown = [e for e in events if e not in ALL_EVENT_TYPES]
    if unknown:
        raise InvalidRequest(f"events: unknown event type {unknown[0][:64]!r} (known: {', '.join(ALL_EVENT_TYPES)})",
                             param="events")
    return tuple(e for e in ALL_EVENT_TYPES if e in events)


def register_endpoint(endpoints: WebhookEndpoints, catalog: Catalog, org_id: str, url: object,
                      events: tuple[str, ...] | None = None) -> tuple[WebhookEndpoint, str]:
    """The new endpoint, subscribed to ``events`` (``event_types``; None: every type), and its signing secret
    (``whsec_...``), which is never shown again."""
    problem = webhook_url_problem(url, catalog)
    if problem is not None:
        raise InvalidRequest(problem, param="url")
    secret = new_secret()
    endpoint = endpoints.add_endpoint(org_id, normalized(str(url)), secret, limit=MAX_ENDPOINTS, events=events)
    if endpoint is None:
        raise Conflict(f"an organization may have at most {MAX_ENDPOINTS} webhook endpoints; remove one first",
                       code="webhook_limit_reached")
    return endpoint, secret


def send_test_event(endpoints: WebhookEndpoints, outbox: WebhookOutbox, webhook_log: WebhookLog, catalog: Catalog,
                    settings: Settings, endpoint_id: str, org_id: str | None = None) -> Attempt:
    """A ``webhook.test`` event sent to one endpoint now, by the caller's process, signed and checked like
    every delivery and logged like one; a failure is not retried."""
    endpoint = endpoints.endpoint(endpoint_id, org_id)
    delivery = WebhookDelivery(outbox, webhook_log, catalog, settings)
    due = outbox.enqueue_test_event(endpoint.id, hold_seconds=delivery.hold_seconds,
                                    rotation_overlap=settings.webhooks.rotation_overlap_seconds)
    return asyncio.run(delivery.deliver(due, retry=False))


def rotate_secret(endpoints: WebhookEndpoints, settings: Settings, endpoint_id: str, org_id: str | None = None,
                  ) -> dict[str, Any]:
    """A new secret for the endpoint, shown once; deliveries are signed by both it and the replaced one for
    ``rotation_overlap_seconds`` (the answer's ``previous_secret_expires_at``), then by the new one alone."""
    secret = new_secret()
    endpoint = endpoints.rotate_secret(endpoint_id, secret, org_id)
    assert endpoint.rotated_at is not None  # just set
    until = int(endpoint.rotated_at + settings.webhooks.rotation_overlap_seconds)
    return {**endpoint.as_api(), "secret": secret, "previous_secret_expires_at": until}


# -- the API ----------------------------------------------------------------------------------------------------


def create_webhook(endpoints: WebhookEndpoints, catalog: Catalog, key: ApiKey, raw: bytes) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    body = json_object(raw)
    reject_unrecognized(body, _CREATE_FIELDS)
    if "url" not in body:
        raise InvalidRequest("url is required", param="url")
    events = event_types(body["events"]) if "events" in body else None
    endpoint, secret = register_endpoint(endpoints, catalog, key.org_id, body["url"], events)
    return {**endpoint.as_api(), "secret": secret}


def list_webhooks(endpoints: WebhookEndpoints, key: ApiKey) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    # Every endpoint fits one page (at most MAX_ENDPOINTS), so there is never more.
    return list_page([endpoint.as_api() for endpoint in endpoints.list_endpoints(key.org_id)], has_more=False)


def delete_webhook(endpoints: WebhookEndpoints, key: ApiKey, webhook_id: str) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    removed = endpoints.remove_endpoint(webhook_id, key.org_id)
    return {"id": removed.id, "object": "webhook_endpoint.deleted", "deleted": True}


def _no_fields(raw: bytes) -> None:
    """A route that takes no fields: an empty body, or an empty JSON object."""
    if raw.strip():
        reject_unrecognized(json_object(raw), ())


def rotate_webhook(endpoints: WebhookEndpoints, settings: Settings, key: ApiKey, webhook_id: str, raw: bytes,
                   ) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    _no_fields(raw)
    return rotate_secret(endpoints, settings, webhook_id, key.org_id)


def list_webhook_deliveries(endpoints: WebhookEndpoints, webhook_log: WebhookLog, key: ApiKey, webhook_id: str, *,
                            limit: int, after: str | None) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    endpoint = endpoints.endpoint(webhook_id, key.org_id)
    found, more = webhook_log.list_deliveries(endpoint.id, limit=limit, after=after)
    return list_page([delivery.as_api() for delivery in found], has_more=more)


def replay_webhook_delivery(webhook_log: WebhookLog, key: ApiKey, delivery_id: str, raw: bytes) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    _no_fields(raw)
    return webhook_log.replay_delivery(delivery_id, key.org_id).as_api()
