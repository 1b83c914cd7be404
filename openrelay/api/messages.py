"""``/v1/messages/batches``: Anthropic's Message Batches (service/message_batches.py), for its SDK unchanged.

Its key comes as ``x-api-key`` (Anthropic's header) or as OpenRelay's Bearer; its errors go out in Anthropic's
envelope (api/errors.py, by the path).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse
from starlette.requests import Request

from ..service import message_batches as service
from .context import ApiContext, json_response, query_int
from .errors import ANTHROPIC_PREFIX

__all__ = ["MESSAGE_BATCHES_PATH", "add_message_batch_routes"]

MESSAGE_BATCHES_PATH = ANTHROPIC_PREFIX + "batches"  # its create's body may be as big as a batch create's


def _keyed(request: Request) -> Request:
    """``request``, with its ``x-api-key`` as the Bearer key the API reads when it sends no Authorization."""
    secret = request.headers.get("x-api-key")
    if secret is None or "authorization" in request.headers:
        return request
    request.scope["headers"] = [*request.scope["headers"], (b"authorization", b"Bearer " + secret.encode("latin-1"))]
    return Request(request.scope, request.receive)


def _base(request: Request) -> str:
    """Where the caller reached this server (``results_url`` is an absolute URL, as Anthropic's SDK reads it)."""
    return str(request.base_url).rstrip("/")


def add_message_batch_routes(router: APIRouter, ctx: ApiContext) -> None:
    rt = ctx.rt

    @router.post(MESSAGE_BATCHES_PATH)
    async def create(request: Request) -> Response:
        request = _keyed(request)
        key = await ctx.writer(request)
        raw = await request.body()
        return json_response(await ctx.writing(key, service.create_message_batch, rt, key, raw,
                                               request.headers.get("idempotency-key"), _base(request)))

    @router.get(MESSAGE_BATCHES_PATH)
    async def list_batches(request: Request) -> Response:
        request = _keyed(request)
        query = request.query_params
        limit = query_int(query, "limit", 20)
        return json_response(await ctx.as_reader(request, lambda key: service.list_message_batches(
            rt, key, limit=limit, before_id=query.get("before_id"), after_id=query.get("after_id"),
            base_url=_base(request))))

    @router.get(MESSAGE_BATCHES_PATH + "/{batch_id}")
    async def retrieve(request: Request, batch_id: str) -> Response:
        request = _keyed(request)
        return json_response(await ctx.as_reader(
            request, lambda key: service.get_message_batch(rt, key, batch_id, _base(request))))

    @router.post(MESSAGE_BATCHES_PATH + "/{batch_id}/cancel")
    async def cancel(request: Request, batch_id: str) -> Response:
        request = _keyed(request)
        key = await ctx.writer(request)
        return json_response(await ctx.writing(key, service.cancel_message_batch, rt, key, batch_id,
                                               _base(request)))

    @router.delete(MESSAGE_BATCHES_PATH + "/{batch_id}")
    async def delete(request: Request, batch_id: str) -> Response:
        request = _keyed(request)
        key = await ctx.writer(request)
        return json_response(await ctx.writing(key, service.delete_message_batch, rt, key, batch_id))

    @router.get(MESSAGE_BATCHES_PATH + "/{batch_id}/results")
    async def results(request: Request, batch_id: str) -> Response:
        request = _keyed(request)
        lines = await ctx.as_reader(request, lambda key: service.message_batch_results(rt, key, batch_id))
        return StreamingResponse(lines, media_type="application/x-jsonl")
