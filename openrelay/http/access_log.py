"""One log line per request answered (``orl serve``'s access log): who asked what and how it went, never a key, a
query string or a body."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .request_ids import request_id_of

__all__ = ["AccessLog", "note_org"]

log = logging.getLogger("openrelay.access")


def note_org(scope: Scope, org_id: str) -> None:
    """Tell the access log which organization the request is for (once its key or session is known)."""
    scope.setdefault("state", {})["org"] = org_id


class AccessLog:
    """ASGI middleware, outermost: ``GET /v1/batches/batch_x 200 3.1ms org=org_y request_id=req_z`` when the answer
    has been sent (or the connection closed before it was); ``org=-`` where no key or session was accepted."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0  # no answer began: the client went away, or the app raised through

        async def send_noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noted)
        finally:
            org = scope.get("state", {}).get("org", "-")
            log.info("%s %s %s %.1fms org=%s request_id=%s", scope["method"], scope["path"], status or "-",
                     (time.perf_counter() - started) * 1000, org, request_id_of(scope) or "-")
