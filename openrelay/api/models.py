"""``/v1/models``: the catalog's models, as OpenAI lists them."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.requests import Request

from .context import ApiContext, json_response

__all__ = ["add_model_routes"]


def add_model_routes(router: APIRouter, ctx: ApiContext) -> None:

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        await ctx.reader(request)
        return json_response(ctx.rt.catalog.as_api())

