"""The HTTP API, assembled: its middlewares, its error handling (errors.py) and the routes of each resource (one
module each). It parses requests and renders answers; every decision is in ``service``."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI

from ..http.request_ids import RequestIds
from ..http.writes import OrgWrites
from ..runtime import Runtime
from .batches import CREATE_PATH, add_batch_routes
from .context import ApiContext
from .errors import add_error_handlers
from .files import UPLOAD_PATH, add_file_routes
from .guard import RenderUnexpectedErrors
from .limits import BodyLimits
from .messages import MESSAGE_BATCHES_PATH, add_message_batch_routes
from .models import add_model_routes
from .operator import add_operator_routes
from .webhooks import add_webhook_routes

__all__ = ["create_app"]


def create_app(rt: Runtime, *, writes: OrgWrites | None = None, upload_paths: Iterable[str] = ()) -> FastAPI:
    """The API's app. ``writes``: the process's write hook, shared with what else the assembler mounts (the
    dashboard); ``upload_paths``: those others' routes that stream an upload and count its bytes themselves."""
    app = FastAPI(title="OpenRelay Batches", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RenderUnexpectedErrors)  # added first: the innermost, right around the routes (guard.py)
    app.add_middleware(BodyLimits, create_bytes=rt.settings.http.max_create_body_bytes,  # outside it (limits.py)
                       json_bytes=rt.settings.http.max_json_body_bytes,
                       create_paths={CREATE_PATH: " Send big inputs as an uploaded file (input_file_id).",
                                     MESSAGE_BATCHES_PATH: ""},
                       upload_paths=(UPLOAD_PATH, *upload_paths))
    app.add_middleware(RequestIds, access_log=rt.settings.http.access_log)  # outermost: it sees every answer
    add_error_handlers(app)
    ctx = ApiContext(rt, writes or OrgWrites())
    # Each resource's module adds its routes to the app's own router rather than to an APIRouter of its own that
    # is then included: FastAPI (0.165) keeps an included router as a nested branch, walked again on every request,
    # and ``app.routes`` would no longer list the routes (tests/test_openapi.py reads them).
    for add_routes in (add_operator_routes, add_model_routes, add_file_routes, add_batch_routes, add_webhook_routes,
                       add_message_batch_routes):
        add_routes(app.router, ctx)
    return app
