"""``/v1/files``: upload (http/uploads.py), list, read, download (whole or one byte range, api/ranges.py), delete."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ..http.uploads import receive_upload
from ..service import files as file_service
from .context import ApiContext, json_response
from .ranges import content_range, requested_range

__all__ = ["UPLOAD_PATH", "add_file_routes"]

UPLOAD_PATH = "/v1/files"  # streamed to the blob store and held to the upload limit, not the JSON one (limits.py)


def add_file_routes(router: APIRouter, ctx: ApiContext) -> None:
    rt = ctx.rt

    @router.post(UPLOAD_PATH)
    async def upload_file(request: Request) -> Response:
        key = await ctx.writer(request)
        return json_response((await receive_upload(rt, key, request)).as_api())

    @router.get("/v1/files")
    async def list_files(request: Request, limit: int = 10_000, after: str | None = None,
                         purpose: str | None = None, order: str = "desc") -> Response:
        return json_response(await ctx.as_reader(request, lambda key: file_service.list_files(
            rt.files, key, limit=limit, after=after, purpose=purpose, order=order)))

    @router.get("/v1/files/{file_id}")
    async def get_file(request: Request, file_id: str) -> Response:
        record = await ctx.as_reader(request, lambda key: file_service.get_file(rt, key, file_id))
        return json_response(record.as_api())

    @router.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> Response:
        wanted = requested_range(request.headers.get("range"))
        record, span, chunks = await ctx.as_reader(request, lambda key: file_service.file_content(
            rt, key, file_id, wanted))
        if span is None:
            return StreamingResponse(chunks, media_type="application/octet-stream", headers={
                "content-length": str(record.bytes), "accept-ranges": "bytes"})
        return StreamingResponse(chunks, status_code=206, media_type="application/octet-stream", headers={
            "content-length": str(span[1] - span[0]), "content-range": content_range(span, record.bytes),
            "accept-ranges": "bytes"})

    @router.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> Response:
        key = await ctx.writer(request)
        return json_response(await run_in_threadpool(file_service.delete_file, rt.files, rt.blobs, key, file_id))

