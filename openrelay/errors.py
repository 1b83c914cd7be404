"""The one error tree of OpenRelay.

Every error a client can see is an ``OpenRelayError`` carrying its HTTP status, OpenAI ``type`` and ``code``;
``error_envelope`` is the one builder of the OpenAI envelope (``OpenRelayError.envelope``, the engines' refusals
and the CLI's own errors use it), and ``api/errors.py`` the one place that puts it on the wire (route handlers,
middlewares and the connection alike)::

    OpenRelayError                       500 server_error            also the unexpected error (api/guard.py)
    ├── InvalidRequest                   400 invalid_request_error   bad field, with ``param``
    │   ├── NoValidRecords               400 no_valid_records        every record rejected (extra fields)
    │   ├── InputRefused                 400 workflow_unsupported | input_too_large | input_unreadable
    │   ├── (code given)                 400 invalid_http_request    malformed HTTP, answered by api/http_protocol.py
    │   └── (code given)                 400 server_error            a form Starlette could not parse (api/errors.py)
    ├── Unauthorized                     401 invalid_api_key | invalid_metrics_token
    ├── BudgetExceeded                   402 key_budget_exceeded
    ├── InsufficientScope                403 insufficient_scope
    ├── CsrfRefused                      403 csrf_refused            a dashboard form without its session's token
    ├── NotFound                         404 not_found               ``no_such`` words the "No such ... object"
    ├── MethodNotAllowed                 405 method_not_allowed      a URL asked with a method it does not take
    ├── RequestTimeout                   408 request_timeout         a request's head or body not read in time
    ├── Conflict                         409 (code given: batch_terminal, feature_disabled, idempotency_key_in_use, ...)
    ├── PayloadTooLarge                  413 file_too_large (uploads) | request_too_large (JSON bodies)
    ├── RangeNotSatisfiable              416 range_not_satisfiable   a download's ``Range`` the file has no byte of
    ├── UnprocessableEntity              422 (code given: idempotency_key_reused)
    ├── HeadersTooLarge                  431 headers_too_large       request line and headers over their limit
    ├── StoreError                       500 store_error             a database or blob failure, translated
    │   ├── StoreUnavailable             503 store_unavailable       the database or object store unreachable
    │   │                                                            (refused, timed out, 5xx): ``Retry-After``
    │   ├── BlobMissing                  500 blob_missing            the key names no blob (blobs/base.py)
    │   ├── LeaseLost                    (a worker's, not an answer) its lease was taken over (store/results.py)
    │   └── TransitionRefused            (a worker's, not an answer) a status change its row refused (lifecycle.py)
    ├── EngineUnavailable                (a worker's, not an answer) no answer from an engine (engines/base.py)
    │   └── EngineTimedOut               (a worker's, not an answer) none within the engine's timeout
    ├── CatalogError                     (never an HTTP answer)      a catalog the process refuses to start with
    └── ConfigError                      (never an HTTP answer)      a setting the process refuses to start with

On Anthropic's routes (``/v1/messages/...``) the same errors go out in Anthropic's envelope instead,
``{"type": "error", "error": {"type", "message"}}``, its ``type`` by status (``anthropic_error``).

Driver exceptions (SQLAlchemy, OS errors of the blob store, httpx) are translated at the boundary of the module
that owns the driver; nothing above ``store/``, ``blobs/`` or ``engines/`` sees them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "error_envelope",
    "anthropic_error",
    "anthropic_envelope",
    "OpenRelayError",
    "InvalidRequest",
    "NoValidRecords",
    "InputRefused",
    "PayloadTooLarge",
    "HeadersTooLarge",
    "RequestTimeout",
    "Unauthorized",
    "InsufficientScope",
    "BudgetExceeded",
    "NotFound",
    "no_such",
    "MethodNotAllowed",
    "RangeNotSatisfiable",
    "CsrfRefused",
    "Conflict",
    "UnprocessableEntity",
    "StoreError",
    "StoreUnavailable",
    "CatalogError",
    "ConfigError",
]


def error_envelope(message: str, *, type_: str = "invalid_request_error", code: str | None = None,
                   param: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI error envelope, ``{"error": {"message", "type", "code", "param", ...extra}}``."""
    body: dict[str, Any] = {"message": message, "type": type_, "code": code, "param": param}
    if extra:
        body.update(extra)
    return {"error": body}


# Anthropic's error types by HTTP status (its SDK's ``ErrorObject`` union); any other 4xx is a request error.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def anthropic_error(status: int | None, message: str) -> dict[str, Any]:
    """Anthropic's error object, ``{"type": "error", "error": {"type", "message"}}``, for an answer of
    ``status`` (None: a request refused before it ran, a request error)."""
    kind = _ANTHROPIC_TYPES.get(status or 400) or ("api_error" if (status or 400) >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_envelope(exc: OpenRelayError) -> dict[str, Any]:
    """``exc`` as Anthropic's routes answer it."""
    return anthropic_error(exc.status, exc.public_message or exc.message)


class OpenRelayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = "server_error"
    public_message: str | None = None  # what a client is told instead of ``message``, which is for the log
    retry_after_seconds: int | None = None  # a ``Retry-After`` for the answer: worth trying again this much later

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 extra: dict[str, Any] | None = None, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers  # more headers of the answer, (lower-case name, value): Allow, Content-Range
        if code is not None:
            self.code = code
        self.param = param
        self.extra = extra or {}

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.public_message or self.message, type_=self.type, code=self.code,
                              param=self.param, extra=self.extra)


class InvalidRequest(OpenRelayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request_error"


class NoValidRecords(InvalidRequest):
    code = "no_valid_records"


class InputRefused(InvalidRequest):
    """The whole create is refused because of the input as a whole (workflow, size, unreadable)."""


class PayloadTooLarge(OpenRelayError):
    status = 413
    type = "invalid_request_error"
    code = "file_too_large"


class HeadersTooLarge(OpenRelayError):
    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class RequestTimeout(OpenRelayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class Unauthorized(OpenRelayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class InsufficientScope(OpenRelayError):
    status = 403
    type = "permission_error"
    code = "insufficient_scope"


class BudgetExceeded(OpenRelayError):
    status = 402
    type = "insufficient_quota"
    code = "key_budget_exceeded"


class NotFound(OpenRelayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


def no_such(kind: str, object_id: str, *, param: str | None = None) -> NotFound:
    """``No such Batch object: batch_...``: an id the caller's organization does not hold (another's answers the
    same). ``kind`` as OpenAI words it: ``Batch``, ``File``."""
    return NotFound(f"No such {kind} object: {object_id}", param=param)


class MethodNotAllowed(OpenRelayError):
    """A URL we serve, asked with a method it does not take (the router's refusal), with ``Allow``."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RangeNotSatisfiable(OpenRelayError):
    """A download's ``Range`` that the file has no byte of (``bytes=N-`` at or past its end: nothing new yet, for a
    follower); the answer's ``Content-Range`` gives the file's size."""

    status = 416
    type = "invalid_request_error"
    code = "range_not_satisfiable"


class CsrfRefused(OpenRelayError):
    """A dashboard form without its session's CSRF token (answered as a page, never JSON)."""

    status = 403
    type = "invalid_request_error"
    code = "csrf_refused"


class Conflict(OpenRelayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class UnprocessableEntity(OpenRelayError):
    """Well-formed, but it contradicts what the server already holds (a key reused with another body)."""

    status = 422
    type = "invalid_request_error"
    code = "unprocessable_entity"


class StoreError(OpenRelayError):
    """The message names the driver's error (for logs); a client is told only that the store failed, never the
    SQL, its parameters or a path."""

    status = 500
    type = "server_error"
    code = "store_error"
    public_message = "the service's store did not answer; try again later"


class StoreUnavailable(StoreError):
    """The database or the object store cannot be reached right now (a refused connection, a timeout, a 5xx
    after the driver's own retries): nothing was kept, and the same request may succeed later. The API answers
    503 with ``Retry-After: retry_after_seconds``; a worker keeps what it holds and tries again with backoff."""

    status = 503
    code = "store_unavailable"
    retry_after_seconds = 5
    public_message = "the service's store is unreachable right now; nothing was kept, try again later"


class CatalogError(OpenRelayError):
    """The catalog is unusable (a missing field, an unknown engine kind, a model file that is not there). Found
    when ``orl serve`` or ``orl worker`` starts, which then exits with this message; never met by a batch."""

    code = "invalid_catalog"


class ConfigError(OpenRelayError):
    """A setting the process cannot start with (a ``--blob-url`` it cannot parse, a bucket it cannot reach).
    Found when ``orl serve``, ``orl worker`` or ``orl admin`` starts, which then exits with this message."""

    code = "invalid_config"
