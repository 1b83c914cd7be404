"""The last line of defence: an exception no handler expected still answers in the OpenAI envelope.

Starlette's own fallback answers ``text/plain`` and re-raises, and uvicorn then closes the connection, so the
client's next keep-alive request is reset. This middleware sits inside that fallback: it logs the traceback,
answers 500 ``server_error`` as JSON and returns normally, so the connection stays usable. The goal is still
that no input reaches it (a bad input is a 4xx decided where it is understood); this is for our own bugs.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import OpenRelayError
from ..http.request_ids import request_id_of
from .errors import send_error

__all__ = ["RenderUnexpectedErrors", "UNEXPECTED_MESSAGE"]

UNEXPECTED_MESSAGE = "The server had an error while processing your request."
_log = logging.getLogger("openrelay.api")


class RenderUnexpectedErrors:
    """ASGI middleware: an unexpected exception before the answer started becomes a 500 in the envelope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            if started:
                raise  # a streamed answer broke midway: only closing the connection tells the client
            request_id = request_id_of(scope)
            _log.exception("unexpected error answering %s %s (request_id=%s)", scope.get("method"), scope.get("path"),
                           request_id)
            await send_error(send, OpenRelayError(UNEXPECTED_MESSAGE), request_id=request_id,
                             path=scope.get("path", ""))
