"""Who may read ``GET /metrics``: anyone, unless the operator set a metrics token (``--metrics-token``,
``OPENRELAY_METRICS_TOKEN``); then only ``Authorization: Bearer <token>``. The token is the operator's: no API key
opens the metrics, which show model names, queue depths and process memory."""

from __future__ import annotations

import hashlib
import hmac

from ..errors import Unauthorized
from .auth import bearer_token

__all__ = ["require_metrics_token"]


def require_metrics_token(expected: str | None, authorization: str | None) -> None:
    """Raises ``Unauthorized`` (401 ``invalid_metrics_token``) unless no token is set or ``authorization``
    carries it. Compared in constant time, over digests so that not even the token's length leaks."""
    if expected is None:
        return
    given = bearer_token(authorization)
    if given is None or not hmac.compare_digest(_digest(given), _digest(expected)):
        raise Unauthorized("GET /metrics needs the operator's metrics token: send 'Authorization: Bearer <token>'",
                           code="invalid_metrics_token")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
