"""``/v1/webhooks``: register, list, remove and rotate the secret of the organization's webhook endpoints, list an
endpoint's deliveries and replay one (service/webhooks.py)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ..service import webhooks as webhook_service
from .context import ApiContext, json_response

__all__ = ["add_webhook_routes"]


def add_webhook_routes(router: APIRouter, ctx: ApiContext) -> None:
    rt = ctx.rt

    @router.post("/v1/webhooks")
    async def create_webhook(request: Request) -> Response:
        key = await ctx.writer(request)
        raw = await request.body()
        return json_response(await run_in_threadpool(webhook_service.create_webhook, rt.webhook_endpoints, rt.catalog,
                                                     key, raw))

    @router.get("/v1/webhooks")
    async def list_webhooks(request: Request) -> Response:
        key = await ctx.writer(request)
        return json_response(await run_in_threadpool(webhook_service.list_webhooks, rt.webhook_endpoints, key))

    @router.delete("/v1/webhooks/{webhook_id}")
    async def delete_webhook(request: Request, webhook_id: str) -> Response:
        key = await ctx.writer(request)
        return json_response(await run_in_threadpool(webhook_service.delete_webhook, rt.webhook_endpoints, key,
                                                     webhook_id))

    @router.post("/v1/webhooks/{webhook_id}/rotate")
    async def rotate_webhook(request: Request, webhook_id: str) -> Response:
        key = await ctx.writer(request)
        raw = await request.body()
        return json_response(await run_in_threadpool(webhook_service.rotate_webhook, rt.webhook_endpoints, rt.settings,
                                                     key, webhook_id, raw))

    @router.get("/v1/webhooks/{webhook_id}/deliveries")
    async def list_webhook_deliveries(request: Request, webhook_id: str, limit: int = 20,
                                      after: str | None = None) -> Response:
        key = await ctx.writer(request)
        return json_response(await run_in_threadpool(
            lambda: webhook_service.list_webhook_deliveries(rt.webhook_endpoints, rt.webhook_log, key, webhook_id,
                                                            limit=limit, after=after)))

    @router.post("/v1/webhooks/deliveries/{delivery_id}/replay")
    async def replay_webhook_delivery(request: Request, delivery_id: str) -> Response:
        key = await ctx.writer(request)
        raw = await request.body()
        return json_response(await run_in_threadpool(webhook_service.replay_webhook_delivery, rt.webhook_log, key,
                                                     delivery_id, raw))
