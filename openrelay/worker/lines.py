"""Result lines, exactly as docs/api-contract.md §12 shows them. One object per line; join by custom_id."""

from __future__ import annotations

from typing import Any

import orjson

from ..lifecycle import End
from ..types import Rejection

__all__ = ["output_line", "error_line", "engine_error_line", "rejection_line", "unrun_line"]


def _line(custom_id: str, response: dict[str, Any] | None, error: dict[str, Any] | None) -> bytes:
    return orjson.dumps({"id": f"batch_req_{custom_id}", "custom_id": custom_id, "response": response,
                         "error": error}) + b"\n"


def output_line(custom_id: str, body: dict[str, Any], *, catalog_model: str, request_id: str) -> bytes:
    """``request_id``: the one the record's engine calls carried (``x-request-id``), as OpenAI's lines have it."""
    body["model"] = catalog_model  # whatever the engine calls it, users see the catalog name
    return _line(custom_id, {"status_code": 200, "request_id": request_id, "body": body}, None)


def error_line(custom_id: str, *, code: str, message: str, status_code: int | None = None,
               request_id: str | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if status_code is not None:
        error["status_code"] = status_code
    if request_id is not None:
        error["request_id"] = request_id
    return _line(custom_id, None, error)


def engine_error_line(custom_id: str, status_code: int, body: dict[str, Any], request_id: str) -> bytes:
    """A record the engine refused (4xx) or kept failing (5xx after retries)."""
    err = found if isinstance(found := body.get("error"), dict) else body
    code = next((v for v in (err.get("code"), err.get("type")) if isinstance(v, str) and v), None)
    code = code or ("server_error" if status_code >= 500 else "invalid_request_error")
    message = found if isinstance(found := err.get("message"), str) else None
    return error_line(custom_id, code=code, message=message or f"engine answered {status_code}",
                      status_code=status_code, request_id=request_id)


def rejection_line(rejection: Rejection) -> bytes:
    """A record the create rejected: no status_code, and the message names its input line."""
    return error_line(rejection.custom_id, code=rejection.code, message=f"line {rejection.line}: {rejection.message}")


def unrun_line(custom_id: str, end: End, *, waiting: bool = False) -> bytes:
    """A record the batch's ``end`` left unrun: it never started, or (``waiting``) its engine was not answering."""
    assert end.unrun_code is not None
    return error_line(custom_id, code=end.unrun_code, message=end.unrun_message(waiting=waiting))
