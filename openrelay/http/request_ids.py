"""Every answer's request id: ``x-request-id`` (what the ``openai`` SDK reads) and ``request-id`` (the ``anthropic``
SDK's), the same id in the access log, in a 5xx's message and, when tracing, on the request's span (FastAPI's own,
from the tracer provider ``openrelay/tracing.py`` sets)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import tracing
from ..ids import new_request_id

__all__ = ["RequestIds", "request_id_of", "id_headers"]


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


def id_headers(request_id: str) -> tuple[tuple[bytes, bytes], ...]:
    return (b"x-request-id", request_id.encode()), (b"request-id", request_id.encode())


class RequestIds:
    """ASGI middleware, outside every other but the access log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        tracing.note("openrelay.request_id", request_id)
        ids = id_headers(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *ids]
            await send(message)

        await self.app(scope, receive, send_with_id)
