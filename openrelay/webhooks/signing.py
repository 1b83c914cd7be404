"""Standard Webhooks signing (https://www.standardwebhooks.com), computed by the ``standardwebhooks`` package so that
what receivers verify is what was signed; during a rotation one signature per secret. docs/webhooks.md, "Verify"."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from standardwebhooks import Webhook

__all__ = ["new_secret", "signed_headers", "SECRET_PREFIX"]

SECRET_PREFIX = "whsec_"
_SECRET_BYTES = 32


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(_SECRET_BYTES)).decode()


def signed_headers(signing_secrets: str | Sequence[str], event_id: str, body: bytes, timestamp: int,
                   ) -> dict[str, str]:
    """The headers of one attempt, signed by each secret (the current one first): ``timestamp`` is the
    attempt's (seconds since the epoch), so a receiver can refuse replays of old ones; ``event_id`` stays the
    same on every attempt, so it can drop repeats."""
    if isinstance(signing_secrets, str):
        signing_secrets = [signing_secrets]
    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(Webhook(secret).sign(event_id, signed_at, body.decode())
                                      for secret in signing_secrets),
        "content-type": "application/json",
    }
