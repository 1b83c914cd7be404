"""The webhook store: an organization's endpoints (``store/webhook_endpoints.py``) and the outbox of events,
their deliveries and the delivery log (``store/webhook_outbox.py``), over one database."""

from __future__ import annotations

from .webhook_endpoints import WebhookEndpoints
from .webhook_outbox import WebhookOutbox

__all__ = ["WebhookStore"]


class WebhookStore(WebhookEndpoints, WebhookOutbox):
    """Both halves as the one object ``Runtime`` and ``orl admin`` hand out."""
