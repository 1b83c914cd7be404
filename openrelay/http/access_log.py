"""One log line per request answered (``orl serve``'s access log, written by ``http/request_ids.py``): who asked
what and how it went, never a key, a query string or a body."""

from __future__ import annotations

import logging

from starlette.types import Scope

__all__ = ["log_answer", "note_org"]

log = logging.getLogger("openrelay.access")


def note_org(scope: Scope, org_id: str) -> None:
    """Tell the access log which organization the request is for (once its key or session is known)."""
    scope.setdefault("state", {})["org"] = org_id


def log_answer(scope: Scope, status: int, seconds: float) -> None:
    """``GET /v1/batches/batch_x 200 3.1ms org=org_y request_id=req_z``: status ``-`` where no answer began (the
    client went away, or the app raised through), ``org=-`` where no key or session was accepted."""
    state = scope.get("state", {})
    log.info("%s %s %s %.1fms org=%s request_id=%s", scope["method"], scope["path"], status or "-", seconds * 1000,
             state.get("org", "-"), state.get("request_id", "-"))
