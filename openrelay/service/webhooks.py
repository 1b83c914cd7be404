"""Webhook endpoints: what an API key with ``batch.write`` (``/v1/webhooks``) and the operator (``orl admin
webhook``) may register, list, remove and test. Events themselves are written by the store with each terminal
status and sent by the workers (``openrelay/webhooks``)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..catalog import Catalog
from ..config import Settings
from ..errors import Conflict, InvalidRequest
from ..store.webhook_endpoints import WebhookEndpoint
from ..store.webhooks import WebhookStore
from ..types import ApiKey, Scope
from ..webhooks.delivery import Attempt, WebhookDelivery
from ..webhooks.network import normalized, webhook_url_problem
from ..webhooks.signing import new_secret
from .auth import require
from .bodies import json_object, reject_unrecognized
from .pages import list_page

__all__ = ["MAX_ENDPOINTS", "register_endpoint", "send_test_event", "create_webhook", "list_webhooks",
           "delete_webhook"]

MAX_ENDPOINTS = 16  # per organization: every terminal status writes a delivery to each, in its transaction
_CREATE_FIELDS = {"url"}


def register_endpoint(store: WebhookStore, catalog: Catalog, org_id: str, url: object,
                      ) -> tuple[WebhookEndpoint, str]:
    """The new endpoint and its signing secret (``whsec_...``), which is never shown again."""
    problem = webhook_url_problem(url, catalog)
    if problem is not None:
        raise InvalidRequest(problem, param="url")
    secret = new_secret()
    endpoint = store.add_endpoint(org_id, normalized(str(url)), secret, limit=MAX_ENDPOINTS)
    if endpoint is None:
        raise Conflict(f"an organization may have at most {MAX_ENDPOINTS} webhook endpoints; remove one first",
                       code="webhook_limit_reached")
    return endpoint, secret


def send_test_event(store: WebhookStore, catalog: Catalog, settings: Settings, endpoint_id: str,
                    org_id: str | None = None) -> Attempt:
    """A ``webhook.test`` event sent to one endpoint now, by the caller's process, signed and checked like
    every delivery and logged like one; a failure is not retried."""
    endpoint = store.endpoint(endpoint_id, org_id)
    delivery = WebhookDelivery(store, catalog, settings)
    due = store.enqueue_test_event(endpoint.id, hold_seconds=delivery.hold_seconds)
    return asyncio.run(delivery.deliver(due, retry=False))


# -- the API ----------------------------------------------------------------------------------------------------


def create_webhook(store: WebhookStore, catalog: Catalog, key: ApiKey, raw: bytes) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    body = json_object(raw)
    reject_unrecognized(body, _CREATE_FIELDS)
    if "url" not in body:
        raise InvalidRequest("url is required", param="url")
    endpoint, secret = register_endpoint(store, catalog, key.org_id, body["url"])
    return {**endpoint.as_api(), "secret": secret}


def list_webhooks(store: WebhookStore, key: ApiKey) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    # Every endpoint fits one page (at most MAX_ENDPOINTS), so there is never more.
    return list_page([endpoint.as_api() for endpoint in store.list_endpoints(key.org_id)], has_more=False)


def delete_webhook(store: WebhookStore, key: ApiKey, webhook_id: str) -> dict[str, Any]:
    require(key, Scope.BATCH_WRITE)
    removed = store.remove_endpoint(webhook_id, key.org_id)
    return {"id": removed.id, "object": "webhook_endpoint.deleted", "deleted": True}


