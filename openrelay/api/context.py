"""What every API route shares: who is calling, and how a route runs its service call (a write on a thread that
tells the write hook; a read through the store's async face; a poll, whose answer may be kept briefly)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.requests import Request

from ..errors import InvalidRequest
from ..http.request_ids import note_org
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service.auth import KeyCache
from ..types import ApiKey
from .poll_cache import PollCache

__all__ = ["ApiContext", "json_response", "query_int"]

T = TypeVar("T")

_INT = TypeAdapter(int)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def query_int(query: QueryParams, name: str, default: int) -> int:
    """An integer query parameter, parsed as FastAPI parses a declared ``int`` (pydantic's lax mode), refused as
    the ``RequestValidationError`` handler (api/errors.py) words FastAPI's refusal."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        return _INT.validate_python(raw)
    except ValidationError as exc:
        raise InvalidRequest(f"{name}: {exc.errors()[0]['msg']}", param=name) from None


def _noted(request: Request, key: ApiKey) -> ApiKey:
    note_org(request.scope, key.org_id)  # for the access log (http/request_ids.py)
    return key


class ApiContext:
    """One per app. ``writes`` is the process's write hook: every write of the API (here) or the dashboard
    (web/pages.py) tells it, and the poll cache forgets that organization's answers."""

    def __init__(self, rt: Runtime, writes: OrgWrites) -> None:
        self.rt = rt
        self.writes = writes
        self.keys = KeyCache(rt.accounts, rt.settings.reads.key_cache_seconds)
        self.polls = PollCache(rt.settings.reads.poll_cache_seconds)
        writes.listen(self.polls.forget)

    async def writer(self, request: Request) -> ApiKey:
        """The key of a request that writes, as the store holds it now."""
        return _noted(request, await run_in_threadpool(self.keys.authenticate, request.headers.get("authorization")))

    async def reader(self, request: Request) -> ApiKey:
        """The key of a request that only reads, from memory when it was checked recently (see ``KeyCache``)."""
        authorization = request.headers.get("authorization")
        key = self.keys.cached(authorization)
        if key is None:
            key = await self.rt.db.run(self.keys.for_read, authorization)
        return _noted(request, key)

    async def writing(self, key: ApiKey, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on a thread, for a request that writes the caller's batches; the write hook is told
        when it returns or fails."""
        try:
            return await run_in_threadpool(call, *args)
        finally:
            self.writes.wrote(key.org_id)

    async def as_reader(self, request: Request, read: Callable[[ApiKey], T]) -> T:
        """``read(key)`` for a request that only reads, through the store's async face."""
        return await self.rt.db.run(read, await self.reader(request))

    async def poll(self, request: Request, answer: Callable[[ApiKey], Any]) -> Response:
        """The JSON of ``answer(key)`` for a poll (a batch, a page of batches), or the same bytes this process
        gave the same key for the same URL less than ``poll_cache_seconds`` ago (``api/poll_cache.py``)."""
        key = await self.reader(request)
        target = request.scope["path"] + "?" + request.scope["query_string"].decode("latin-1")

        async def read() -> bytes:
            return orjson.dumps(await self.rt.db.run(answer, key))

        return Response(await self.polls.answer(key.id, key.org_id, target, read), media_type="application/json")
