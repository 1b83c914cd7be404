"""``/v1/models``: the catalog's models, as OpenAI lists and retrieves them."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.requests import Request

from ..errors import NotFound
from .context import ApiContext, json_response

__all__ = ["add_model_routes"]


def add_model_routes(router: APIRouter, ctx: ApiContext) -> None:

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        await ctx.reader(request)
        return json_response(ctx.rt.catalog.as_api())

    @router.get("/v1/models/{model_id:path}")  # ids hold a slash: openrelay/smollm2-135m
    async def model(request: Request, model_id: str) -> Response:
        await ctx.reader(request)
        try:
            return json_response(ctx.rt.catalog.model_object(model_id))
        except KeyError:
            raise NotFound(f"The model '{model_id}' does not exist", param="model", code="model_not_found") from None

