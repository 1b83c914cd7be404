"""The webhook store: an organization's endpoints (``store/webhook_endpoints.py``), the outbox of events, their
deliveries and the delivery log (``store/webhook_outbox.py``), and replays and pruning (``store/webhook_log.py``),
over one database."""

from __future__ import annotations

from .webhook_endpoints import WebhookEndpoints
from .webhook_log import WebhookLog
from .webhook_outbox import WebhookOutbox

__all__ = ["WebhookStore"]


class WebhookStore(WebhookEndpoints, WebhookOutbox, WebhookLog):
    """The three parts as the one object ``Runtime`` and ``orl admin`` hand out."""
