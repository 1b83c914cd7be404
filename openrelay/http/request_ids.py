"""Every answer's request id: ``x-request-id`` (what the ``openai`` SDK reads) and ``request-id`` (the ``anthropic``
SDK's), the same id in the access log, in a 5xx's message and, when tracing, on the request's span (FastAPI's own,
from the tracer provider ``openrelay/tracing.py`` sets). The access log: one line per request answered, who asked
what and how it went, never a key, a query string or a body."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import tracing
from ..ids import new_request_id

__all__ = ["RequestIds", "request_id_of", "id_headers", "note_org"]

log = logging.getLogger("openrelay.access")


def request_id_of(scope: Mapping[str, Any]) -> str | None:
    return scope.get("state", {}).get("request_id")


def id_headers(request_id: str) -> tuple[tuple[bytes, bytes], ...]:
    return (b"x-request-id", request_id.encode()), (b"request-id", request_id.encode())


class RequestIds:
    """ASGI middleware, the outermost: gives each request its id and, with ``access_log``, writes its line once the
    answer has been sent (or the connection closed before it was). One layer for both: a poll pays for one."""

    def __init__(self, app: ASGIApp, *, access_log: bool) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        tracing.note("openrelay.request_id", request_id)
        ids = id_headers(request_id)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), *ids]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                _log_answer(scope, status, time.perf_counter() - started)


def note_org(scope: Scope, org_id: str) -> None:
    """Tell the access log which organization the request is for (once its key or session is known)."""
    scope.setdefault("state", {})["org"] = org_id


def _log_answer(scope: Scope, status: int, seconds: float) -> None:
    """``GET /v1/batches/batch_x 200 3.1ms org=org_y request_id=req_z``: status ``-`` where no answer began (the
    client went away, or the app raised through), ``org=-`` where no key or session was accepted."""
    state = scope.get("state", {})
    log.info("%s %s %s %.1fms org=%s request_id=%s", scope["method"], scope["path"], status or "-", seconds * 1000,
             state.get("org", "-"), state.get("request_id", "-"))
