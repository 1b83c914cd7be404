"""The HTTP API. It parses requests and renders answers; every decision is in ``service``."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InvalidRequest, NotFound, OpenRelayError
from ..metrics import register_queue_depths
from ..runtime import Runtime
from ..service import batches as batch_service
from ..service import files as file_service
from ..service import progress as progress_service
from ..service import retry as retry_service
from ..service import webhooks as webhook_service
from ..service.auth import Keys
from ..service.metrics_access import require_metrics_token
from ..store.async_reads import AsyncReads
from ..store.compiled import Plan, reads_are_local, run_plan
from ..store.read_cache import KeptRows
from ..types import ApiKey
from ..web.routes import mount_dashboard
from .guard import RenderUnexpectedErrors
from .limits import BodyLimits
from .openapi import document_bytes
from .ranges import content_range, range_start
from .uploads import receive_upload

__all__ = ["create_app"]

T = TypeVar("T")
log = logging.getLogger("openrelay.api")


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


_INT = TypeAdapter(int)


def _query_int(query: QueryParams, name: str, default: int) -> int:
    """An integer query parameter, parsed as FastAPI parses a declared ``int`` (pydantic's lax mode), refused as
    the ``RequestValidationError`` handler below words FastAPI's refusal."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        return _INT.validate_python(raw)
    except ValidationError as exc:
        raise InvalidRequest(f"{name}: {exc.errors()[0]['msg']}", param=name) from None


def render_error(exc: OpenRelayError) -> Response:
    response = _json(exc.envelope(), exc.status)
    retry_after = getattr(exc, "retry_after_seconds", None)  # StoreUnavailable: 503, worth trying again later
    if retry_after is not None:
        response.headers["retry-after"] = str(retry_after)
    return response


def create_app(rt: Runtime) -> FastAPI:
    app = FastAPI(title="OpenRelay Batches", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RenderUnexpectedErrors)  # added first: the innermost, right around the routes (guard.py)
    app.add_middleware(BodyLimits, create_bytes=rt.settings.max_create_body_bytes,  # outside it (limits.py)
                       json_bytes=rt.settings.max_json_body_bytes)

    @app.exception_handler(OpenRelayError)
    async def _ours(request: Request, exc: OpenRelayError) -> Response:
        if exc.status >= 500:  # the client sees a generic message; the operator needs the real one
            log.error("%s %s answered %d: %s", request.method, request.url.path, exc.status, exc.message)
        return render_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return render_error(InvalidRequest(f"{param}: {first.get('msg', 'invalid request')}", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return render_error(NotFound("Unknown request URL"))
        err = OpenRelayError(str(exc.detail), code=None)
        err.status = exc.status_code
        err.type = "invalid_request_error"
        return render_error(err)

    keys = Keys(rt.accounts, rt.settings.key_cache_seconds)

    async def caller(request: Request) -> ApiKey:
        """The key of a request that writes, as the store holds it now."""
        return await run_in_threadpool(keys.authenticate, request.headers.get("authorization"))

    reads_on_loop = reads_are_local(rt.db)
    loop_reads = None if reads_on_loop else AsyncReads(rt.db, keep_rows=rt.settings.poll_cache)
    kept_here = KeptRows() if reads_on_loop and rt.settings.poll_cache else None  # the loop's (compiled.run_plan)
    if loop_reads is not None:
        app.router.on_shutdown.append(loop_reads.close)

    def wrote(org_id: str) -> None:
        """A request of this process wrote ``org_id``'s batches: the reads kept of it are forgotten, so the
        caller's next poll here sees its own write without waiting for PostgreSQL's notice
        (``store.read_cache``; SQLite's ``data_version`` sees it anyway). The dashboard's writes call it too."""
        if loop_reads is not None:
            loop_reads.cache.changed(org_id)

    app.state.org_wrote = wrote

    async def writing(key: ApiKey, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on a thread, for a request that writes the caller's batches; ``wrote`` when it
        returns or fails."""
        try:
            return await run_in_threadpool(call, *args)
        finally:
            wrote(key.org_id)

    async def as_reader(request: Request, read: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``read(rt, key, ...)`` for a request that only reads, with the key from memory when it was checked
        recently (see ``Keys``). The key's lookup, if needed, and the read share one hop to a thread; the loop's
        own executor, which costs half what ``run_in_threadpool`` does."""
        authorization = request.headers.get("authorization")
        key = keys.cached(authorization)
        loop = asyncio.get_running_loop()
        if key is not None:
            return await loop.run_in_executor(None, functools.partial(read, rt, key, *args, **kwargs))
        return await loop.run_in_executor(
            None, lambda: read(rt, keys.for_read(authorization), *args, **kwargs))

    async def by_plan(request: Request, make_plan: Callable[..., Plan[T]], *args: Any, **kwargs: Any) -> T:
        """The answer of the plan ``make_plan(rt, key, ...)`` (``store.compiled``), run without leaving the event
        loop: on SQLite straight on the loop (a local read is cheaper than a hop, see ``reads_are_local``), on
        PostgreSQL on the loop's own connections (``store.async_reads``). Only a key that is not in memory
        goes to a thread to be looked up."""
        authorization = request.headers.get("authorization")
        key = keys.cached(authorization)
        if key is None:
            key = await asyncio.get_running_loop().run_in_executor(None, keys.for_read, authorization)
        if loop_reads is None:
            return run_plan(rt.db, make_plan(rt, key, *args, **kwargs), kept_here)
        return await loop_reads.run(lambda: make_plan(rt, key, *args, **kwargs))

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    openapi_document = document_bytes()

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return Response(openapi_document, media_type="application/json")

    register_queue_depths(rt.batches.queue_depths)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        require_metrics_token(rt.settings.metrics_token, request.headers.get("authorization"))
        return Response(await run_in_threadpool(generate_latest), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        if keys.cached(authorization) is None:
            await run_in_threadpool(keys.for_read, authorization)
        return _json(rt.catalog.as_api())

    # -- files ------------------------------------------------------------------------------------------------

    @app.post("/v1/files")
    async def upload_file(request: Request) -> Response:
        key = await caller(request)
        return _json((await receive_upload(rt, key, request)).as_api())

    @app.get("/v1/files")
    async def list_files(request: Request, limit: int = 10_000, after: str | None = None,
                         purpose: str | None = None) -> Response:
        return _json(await as_reader(request, file_service.list_files, limit=limit, after=after, purpose=purpose))

    @app.get("/v1/files/{file_id}")
    async def get_file(request: Request, file_id: str) -> Response:
        return _json((await as_reader(request, file_service.get_file, file_id)).as_api())

    @app.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> Response:
        start = range_start(request.headers.get("range"))  # bytes=N-: what a follower has not read yet
        record, chunks = await as_reader(request, file_service.file_content, file_id, start or 0)
        if start is None:
            return StreamingResponse(chunks, media_type="application/octet-stream",
                                     headers={"content-length": str(record.bytes)})
        if start >= record.bytes:
            refused = OpenRelayError(f"the file has {record.bytes} bytes; nothing starts at {start}",
                                     code="range_not_satisfiable")
            refused.status, refused.type = 416, "invalid_request_error"
            response = render_error(refused)
            response.headers["content-range"] = content_range(start, record.bytes)
            return response
        return StreamingResponse(chunks, status_code=206, media_type="application/octet-stream",
                                 headers={"content-length": str(record.bytes - start),
                                          "content-range": content_range(start, record.bytes)})

    @app.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> Response:
        key = await caller(request)
        return _json(await run_in_threadpool(file_service.delete_file, rt, key, file_id))

    # -- batches ----------------------------------------------------------------------------------------------

    @app.post("/v1/batches")
    async def create_batch(request: Request) -> Response:
        key = await caller(request)
        raw = await request.body()
        answer = await writing(key, batch_service.create_batch, rt, key, raw, request.headers.get("idempotency-key"))
        return Response(answer, media_type="application/json")

    @app.get("/v1/batches")
    async def list_batches(request: Request) -> Response:
        # The query is read here rather than declared as parameters: FastAPI's solving of declared parameters
        # costs more than this poll's own work. ``_query_int`` parses and refuses as FastAPI would.
        query = request.query_params
        return _json(await by_plan(request, progress_service.page_answer_plan,
                                   limit=_query_int(query, "limit", 20), after=query.get("after"),
                                   status=query.get("status"), model=query.get("model"), tag=query.get("tag")))

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(request: Request) -> Response:
        # The id is read from the path here, not declared: see list_batches.
        batch_id = request.path_params["batch_id"]
        return _json(await by_plan(request, progress_service.batch_answer_plan, batch_id))

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> Response:
        key = await caller(request)
        return _json(await writing(
            key, lambda: progress_service.answer_of(rt, batch_service.cancel_batch(rt, key, batch_id))))

    @app.post("/v1/batches/{batch_id}/metadata")
    async def replace_metadata(request: Request, batch_id: str) -> Response:
        key = await caller(request)
        raw = await request.body()
        return _json(await writing(
            key, lambda: progress_service.answer_of(rt, batch_service.replace_metadata(rt, key, batch_id, raw))))

    @app.post("/v1/batches/{batch_id}/retry")
    async def retry_batch(request: Request, batch_id: str) -> Response:
        key = await caller(request)
        raw = await request.body()
        answer = await writing(key, retry_service.retry_batch, rt, key, batch_id, raw,
                               request.headers.get("idempotency-key"))
        return Response(answer, media_type="application/json")

    # -- webhooks (service/webhooks.py) ----------------------------------------------------------------------------

    @app.post("/v1/webhooks")
    async def create_webhook(request: Request) -> Response:
        key = await caller(request)
        raw = await request.body()
        return _json(await run_in_threadpool(webhook_service.create_webhook, rt, key, raw))

    @app.get("/v1/webhooks")
    async def list_webhooks(request: Request) -> Response:
        key = await caller(request)
        return _json(await run_in_threadpool(webhook_service.list_webhooks, rt, key))

    @app.delete("/v1/webhooks/{webhook_id}")
    async def delete_webhook(request: Request, webhook_id: str) -> Response:
        key = await caller(request)
        return _json(await run_in_threadpool(webhook_service.delete_webhook, rt, key, webhook_id))

    mount_dashboard(app, rt)  # the dashboard's pages (openrelay/web): HTML, outside the OpenAPI document
    return app
