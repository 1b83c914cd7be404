"""The HTTP API. It parses requests and renders answers; every decision is in ``service``."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InvalidRequest, NotFound, OpenRelayError, PayloadTooLarge
from ..metrics import register_queue_depths
from ..runtime import Runtime
from ..service import batches as batch_service
from ..service import files as file_service
from ..service.auth import authenticate
from ..service.metrics_access import require_metrics_token
from ..types import ApiKey
from .guard import RenderUnexpectedErrors
from .multipart import stream_form
from .openapi import document_bytes

__all__ = ["create_app"]


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def render_error(exc: OpenRelayError) -> Response:
    return _json(exc.envelope(), exc.status)


def create_app(rt: Runtime) -> FastAPI:
    app = FastAPI(title="OpenRelay Batches", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RenderUnexpectedErrors)  # added first: the innermost, right around the routes (guard.py)

    @app.exception_handler(OpenRelayError)
    async def _ours(_request: Request, exc: OpenRelayError) -> Response:
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

    async def caller(request: Request) -> ApiKey:
        return await run_in_threadpool(authenticate, rt, request.headers.get("authorization"))

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
        await caller(request)
        return _json(rt.catalog.as_api())

    # -- files ------------------------------------------------------------------------------------------------

    @app.post("/v1/files")
    async def upload_file(request: Request) -> Response:
        key = await caller(request)
        declared = int(request.headers.get("content-length") or 0)
        if declared > rt.settings.max_upload_bytes + 64 * 1024:
            raise PayloadTooLarge(f"file is larger than the {rt.settings.max_upload_bytes // 1_000_000} MB limit",
                                  param="file")
        upload = file_service.Upload(rt, key)
        try:
            fields, filename = await stream_form(request.headers.get("content-type"), request.stream(),
                                                 upload.write)
            if filename is None:
                raise InvalidRequest("the form has no 'file' part", param="file")
        except BaseException:
            upload.abort()
            raise
        record = await run_in_threadpool(upload.finish, filename=filename, purpose=fields.get("purpose"))
        return _json(record.as_api())

    @app.get("/v1/files")
    async def list_files(request: Request, limit: int = 10_000, after: str | None = None,
                         purpose: str | None = None) -> Response:
        key = await caller(request)
        return _json(await run_in_threadpool(file_service.list_files, rt, key, limit=limit, after=after,
                                             purpose=purpose))

    @app.get("/v1/files/{file_id}")
    async def get_file(request: Request, file_id: str) -> Response:
        key = await caller(request)
        return _json((await run_in_threadpool(file_service.get_file, rt, key, file_id)).as_api())

    @app.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> Response:
        key = await caller(request)
        record, chunks = await run_in_threadpool(file_service.file_content, rt, key, file_id)
        return StreamingResponse(chunks, media_type="application/octet-stream",
                                 headers={"content-length": str(record.bytes)})

    @app.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> Response:
        key = await caller(request)
        return _json(await run_in_threadpool(file_service.delete_file, rt, key, file_id))

    # -- batches ----------------------------------------------------------------------------------------------

    @app.post("/v1/batches")
    async def create_batch(request: Request) -> Response:
        key = await caller(request)
        raw = await request.body()
        answer = await run_in_threadpool(batch_service.create_batch, rt, key, raw,
                                         request.headers.get("idempotency-key"))
        return Response(answer, media_type="application/json")

    @app.get("/v1/batches")
    async def list_batches(request: Request, limit: Annotated[int, Query()] = 20, after: str | None = None,
                           status: str | None = None, model: str | None = None,
                           tag: str | None = None) -> Response:
        key = await caller(request)
        return _json(await run_in_threadpool(batch_service.list_batches, rt, key, limit=limit, after=after,
                                             status=status, model=model, tag=tag))

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(request: Request, batch_id: str) -> Response:
        key = await caller(request)
        return _json((await run_in_threadpool(batch_service.get_batch, rt, key, batch_id)).as_api())

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> Response:
        key = await caller(request)
        return _json((await run_in_threadpool(batch_service.cancel_batch, rt, key, batch_id)).as_api())

    @app.post("/v1/batches/{batch_id}/metadata")
    async def replace_metadata(request: Request, batch_id: str) -> Response:
        key = await caller(request)
        raw = await request.body()
        return _json((await run_in_threadpool(batch_service.replace_metadata, rt, key, batch_id, raw)).as_api())

    return app
