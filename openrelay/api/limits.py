"""Body limits of the JSON routes, a pure ASGI middleware in front of the app: a create (``create_paths``) may carry
``create_bytes``, every other route ``json_bytes``; uploads (``upload_paths``) pass untouched, their route counts
them. A declared length over the limit is answered 413 before the app runs, a chunked body refused as soon as it
passes it. How, and what it costs a request: docs/design.md, "Body limits"."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import PayloadTooLarge
from ..http.request_ids import request_id_of
from .errors import send_error

__all__ = ["BodyLimits"]

_CLOSE = (b"connection", b"close")


class BodyLimits:
    def __init__(self, app: ASGIApp, *, create_bytes: int, json_bytes: int, create_paths: Mapping[str, str],
                 upload_paths: Collection[str]) -> None:
        self.app = app
        self.create_bytes = create_bytes
        self.json_bytes = json_bytes
        self.create_paths = dict(create_paths)  # each with the hint its refusal ends with
        self.upload_paths = frozenset(upload_paths)

    def limit_for(self, method: str, path: str) -> tuple[int, str] | None:
        """The limit of a route's body and a hint for the refusal; None: the route counts its own."""
        if method == "POST" and path in self.create_paths:
            return self.create_bytes, self.create_paths[path]
        if method == "POST" and path in self.upload_paths:
            return None  # http/uploads.py streams the file and holds it to the upload limit
        return self.json_bytes, ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
            elif name == b"transfer-encoding":
                chunked = True
        if declared is None and not chunked:  # no body (httptools refuses a body with neither)
            await self.app(scope, receive, send)
            return
        limited = self.limit_for(scope["method"], scope["path"])
        if limited is None:
            await self.app(scope, receive, send)
            return
        limit, hint = limited
        if declared is not None:
            if int(declared) > limit:  # httptools has checked it is a number
                await send_error(send, _too_large(limit, hint), close=True, request_id=request_id_of(scope),
                                 path=scope["path"])
            else:
                await self.app(scope, receive, send)
            return

        received = 0
        refused = False

        async def receive_counted() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    raise _too_large(limit, hint)
            return message

        async def send_closing_once_refused(message: Message) -> None:
            if refused and message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        await self.app(scope, receive_counted, send_closing_once_refused)


def _too_large(limit: int, hint: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is over its {limit}-byte limit.{hint}", code="request_too_large")
