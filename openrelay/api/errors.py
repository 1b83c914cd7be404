"""Errors as HTTP answers: the one place an ``OpenRelayError`` goes on the wire as the OpenAI envelope (Anthropic's
under ``/v1/messages/``), whether a route raised it (``add_error_handlers``), a middleware refuses before the app
runs (``send_error``: api/limits.py, api/guard.py) or the connection itself does (``error_answer``:
api/http_protocol.py)."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Send

from ..catalog import ENDPOINTS
from ..errors import InvalidRequest, MethodNotAllowed, NotFound, OpenRelayError, anthropic_envelope
from ..http.request_ids import request_id_of

__all__ = ["ANTHROPIC_PREFIX", "error_answer", "error_response", "send_error", "add_error_handlers"]

ANTHROPIC_PREFIX = "/v1/messages/"  # Anthropic's routes: its envelope, and its x-api-key header (api/messages.py)

log = logging.getLogger("openrelay.api")

_JSON = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")


def error_answer(exc: OpenRelayError, *, close: bool = False, request_id: str | None = None,
                 path: str = "") -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The status, headers and body of the answer to ``exc`` on ``path``; ``close``: the connection closes after
    it. A 5xx's message names its ``request_id``, where OpenAI's does: the server's log has the rest under it;
    Anthropic's envelope carries it beside the error, as Anthropic's does."""
    if path.startswith(ANTHROPIC_PREFIX):
        envelope = anthropic_envelope(exc)
        if request_id is not None:
            envelope["request_id"] = request_id
    else:
        envelope = exc.envelope()
        if exc.status >= 500 and request_id is not None:
            envelope["error"]["message"] += f" (request ID {request_id}: please include it when you report this)"
    body = orjson.dumps(envelope)
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    if exc.retry_after_seconds is not None:  # StoreUnavailable: worth trying again later
        headers.append((b"retry-after", str(exc.retry_after_seconds).encode()))
    headers.extend((name.encode(), value.encode()) for name, value in exc.headers)
    if close:
        headers.append(_CLOSE)
    return exc.status, headers, body


def error_response(exc: OpenRelayError, request_id: str | None = None, path: str = "") -> Response:
    status, headers, body = error_answer(exc, request_id=request_id, path=path)
    response = Response(body, status_code=status)
    response.raw_headers = headers
    return response


async def send_error(send: Send, exc: OpenRelayError, *, close: bool = False, request_id: str | None = None,
                     path: str = "") -> None:
    """Answer ``exc`` from an ASGI middleware, before (instead of) the app."""
    status, headers, body = error_answer(exc, close=close, request_id=request_id, path=path)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _framework_refusal(request: Request, exc: StarletteHTTPException) -> OpenRelayError:
    """What the router (404, 405) or Starlette's form parsing (400) refused, as our error."""
    if exc.status_code == 404:
        return NotFound(_unknown_url(request))
    if exc.status_code == 405:
        allow = ", ".join(sorted(_methods_at(request)))
        return MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}; it takes {allow}",
                                headers=(("allow", allow),))
    return InvalidRequest(str(exc.detail), code="server_error")  # the code these have always carried


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenRelayError)
    async def _ours(request: Request, exc: OpenRelayError) -> Response:
        request_id = request_id_of(request.scope)
        if exc.status >= 500:  # the client sees a generic message; the operator needs the real one
            log.error("%s %s answered %d: %s (request_id=%s)", request.method, request.url.path, exc.status,
                      exc.message, request_id)
        return error_response(exc, request_id, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(InvalidRequest(f"{param}: {first.get('msg', 'invalid request')}", param=param),
                              request_id_of(request.scope), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(_framework_refusal(request, exc), request_id_of(request.scope), request.url.path)


def _unknown_url(request: Request) -> str:
    """The 404's message: what the URL is, and what the caller most likely meant. A client pointed at an
    inference server's routes learns that this is a batch service; one whose base URL lacks ``/v1`` is told so."""
    method, path = request.method, request.url.path
    said = f"Unknown request URL: {method} {path}."
    bare = path.removeprefix("/v1")
    if bare == "/messages":
        return (f"{said} OpenRelay Batches is a batch service: it does not answer /v1/messages requests one by one."
                " Send them as Anthropic's Message Batches (POST /v1/messages/batches, {\"requests\": [{\"custom_id\","
                " \"params\"}]}); the answers come back at the batch's results_url.")
    if bare in _SYNC_PATHS:
        return (f"{said} OpenRelay Batches is a batch service: it does not answer {'/v1' + bare} requests one by one."
                " Write them to a JSONL file, one request per line, upload it (POST /v1/files, purpose \"batch\")"
                " and create a batch of it (POST /v1/batches); the answers come back in its output file.")
    if not path.startswith("/v1/") and _routes_to(request, "/v1" + path):
        return f"{said} The API is under /v1: did you mean {method} /v1{path}? (A client's base URL ends in /v1.)"
    return said


_SYNC_PATHS = frozenset(endpoint.removeprefix("/v1") for endpoint in ENDPOINTS)


def _methods_at(request: Request) -> set[str]:
    """Every method some route of the app takes at the request's path (the router's own 405 names only the first
    route's)."""
    return {method for route in request.app.router.routes if route.matches(request.scope)[0] is not Match.NONE
            for method in getattr(route, "methods", None) or ()}


def _routes_to(request: Request, path: str) -> bool:
    """Whether some route of the app takes ``path`` (with any method)."""
    scope = {**request.scope, "path": path}
    return any(route.matches(scope)[0] is not Match.NONE for route in request.app.router.routes)
