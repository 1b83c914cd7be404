"""Errors as HTTP answers: the one place an ``OpenRelayError`` goes on the wire as the OpenAI envelope, whether a
route raised it (``add_error_handlers``), a middleware refuses before the app runs (``send_error``: api/limits.py,
api/guard.py) or the connection itself does (``error_answer``: api/http_protocol.py)."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from ..errors import InvalidRequest, MethodNotAllowed, NotFound, OpenRelayError

__all__ = ["error_answer", "error_response", "send_error", "add_error_handlers"]

log = logging.getLogger("openrelay.api")

_JSON = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")


def error_answer(exc: OpenRelayError, *, close: bool = False) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The status, headers and body of the answer to ``exc``; ``close``: the connection closes after it."""
    body = orjson.dumps(exc.envelope())
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    if exc.retry_after_seconds is not None:  # StoreUnavailable: worth trying again later
        headers.append((b"retry-after", str(exc.retry_after_seconds).encode()))
    if close:
        headers.append(_CLOSE)
    return exc.status, headers, body


def error_response(exc: OpenRelayError) -> Response:
    status, headers, body = error_answer(exc)
    response = Response(body, status_code=status)
    response.raw_headers = headers
    return response


async def send_error(send: Send, exc: OpenRelayError, *, close: bool = False) -> None:
    """Answer ``exc`` from an ASGI middleware, before (instead of) the app."""
    status, headers, body = error_answer(exc, close=close)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _framework_refusal(exc: StarletteHTTPException) -> OpenRelayError:
    """What the router (404, 405) or Starlette's form parsing (400) refused, as our error."""
    if exc.status_code == 404:
        return NotFound("Unknown request URL")
    if exc.status_code == 405:
        return MethodNotAllowed(str(exc.detail))
    return InvalidRequest(str(exc.detail), code="server_error")  # the code these have always carried


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenRelayError)
    async def _ours(request: Request, exc: OpenRelayError) -> Response:
        if exc.status >= 500:  # the client sees a generic message; the operator needs the real one
            log.error("%s %s answered %d: %s", request.method, request.url.path, exc.status, exc.message)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(InvalidRequest(f"{param}: {first.get('msg', 'invalid request')}", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(_framework_refusal(exc))
