"""``/v1/batches``: create, list, read, cancel, replace the metadata of, and retry a batch's failures."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.requests import Request

from ..service import batches as batch_service
from ..service import progress as progress_service
from ..service import retry as retry_service
from .context import ApiContext, json_response, query_int

__all__ = ["CREATE_PATH", "add_batch_routes"]

CREATE_PATH = "/v1/batches"  # its body may be bigger than other JSON bodies (inline records, limits.py)


def add_batch_routes(router: APIRouter, ctx: ApiContext) -> None:
    rt = ctx.rt

    @router.post(CREATE_PATH)
    async def create_batch(request: Request) -> Response:
        key = await ctx.writer(request)
        raw = await request.body()
        answer = await ctx.writing(key, batch_service.create_batch, rt, key, raw,
                                   request.headers.get("idempotency-key"))
        return Response(answer, media_type="application/json")

    @router.get("/v1/batches")
    async def list_batches(request: Request) -> Response:
        # The query is read here rather than declared as parameters: FastAPI's solving of declared parameters
        # costs more than this poll's own work. ``query_int`` parses and refuses as FastAPI would.
        query = request.query_params
        limit = query_int(query, "limit", 20)
        return await ctx.poll(request, lambda key: progress_service.page_answer(
            rt.batches, key, limit=limit, after=query.get("after"), status=query.get("status"),
            model=query.get("model"), tag=query.get("tag")))

    @router.get("/v1/batches/{batch_id}")
    async def get_batch(request: Request) -> Response:
        # The id is read from the path here, not declared: see list_batches.
        batch_id = request.path_params["batch_id"]
        return await ctx.poll(request, lambda key: progress_service.batch_answer(rt.batches, key, batch_id))

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> Response:
        key = await ctx.writer(request)
        return json_response(await ctx.writing(key, lambda: progress_service.answer(
            rt.db, batch_service.cancel_batch(rt.batches, key, batch_id))))

    @router.post("/v1/batches/{batch_id}/metadata")
    async def replace_metadata(request: Request, batch_id: str) -> Response:
        key = await ctx.writer(request)
        raw = await request.body()
        return json_response(await ctx.writing(key, lambda: progress_service.answer(
            rt.db, batch_service.replace_metadata(rt.batches, key, batch_id, raw))))

    @router.post("/v1/batches/{batch_id}/retry")
    async def retry_batch(request: Request, batch_id: str) -> Response:
        key = await ctx.writer(request)
        raw = await request.body()
        answer = await ctx.writing(key, retry_service.retry_batch, rt, key, batch_id, raw,
                                   request.headers.get("idempotency-key"))
        return Response(answer, media_type="application/json")

