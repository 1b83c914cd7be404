"""The routes an operator's tooling reads: ``/healthz``, ``/openapi.json`` and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ..metrics import register_queue_depths
from ..service.metrics_access import require_metrics_token
from .context import ApiContext, json_response
from .openapi import document_bytes

__all__ = ["add_operator_routes"]


def add_operator_routes(router: APIRouter, ctx: ApiContext) -> None:
    rt = ctx.rt

    @router.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    openapi_document = document_bytes()

    @router.get("/openapi.json")
    async def openapi() -> Response:
        return Response(openapi_document, media_type="application/json")

    register_queue_depths(rt.leases.queue_depths, rt.leases.model_shares)

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        require_metrics_token(rt.settings.metrics_token, request.headers.get("authorization"))
        return Response(await run_in_threadpool(generate_latest), media_type=CONTENT_TYPE_LATEST)

