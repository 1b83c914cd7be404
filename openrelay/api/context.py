"""What every API route shares: who is calling, and the three ways a route runs its service call (a write on a
thread that tells the write hook, a read on the loop's executor, a compiled read plan on the loop itself)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.requests import Request

from ..errors import InvalidRequest
from ..http.access_log import note_org
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service.auth import KeyCache
from ..store.async_reads import AsyncReads
from ..store.compiled import Plan, reads_are_local, run_plan
from ..store.read_cache import KeptRows
from ..types import ApiKey

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
    note_org(request.scope, key.org_id)  # for the access log (http/access_log.py)
    return key


class ApiContext:
    """One per app. ``writes`` is the process's write hook: this context's read cache listens to it, and every
    write of the API (here) or the dashboard (web/pages.py) tells it."""

    def __init__(self, rt: Runtime, writes: OrgWrites) -> None:
        self.rt = rt
        self.writes = writes
        self.keys = KeyCache(rt.accounts, rt.settings.reads.key_cache_seconds)
        reads_on_loop = reads_are_local(rt.db)
        self.loop_reads = None if reads_on_loop else AsyncReads(rt.db, keep_rows=rt.settings.reads.poll_cache)
        self._kept_here = KeptRows() if reads_on_loop and rt.settings.reads.poll_cache else None  # compiled.run_plan's
        if self.loop_reads is not None:
            # A write of this process forgets the reads kept of its organization, so the caller's next poll here
            # sees its own write without waiting for PostgreSQL's notice (SQLite's data_version sees it anyway).
            writes.listen(self.loop_reads.cache.changed)

    async def writer(self, request: Request) -> ApiKey:
        """The key of a request that writes, as the store holds it now."""
        return _noted(request, await run_in_threadpool(self.keys.authenticate, request.headers.get("authorization")))

    async def reader(self, request: Request) -> ApiKey:
        """The key of a request that only reads, from memory when it was checked recently (see ``KeyCache``)."""
        authorization = request.headers.get("authorization")
        key = self.keys.cached(authorization)
        if key is None:
            key = await run_in_threadpool(self.keys.for_read, authorization)
        return _noted(request, key)

    async def writing(self, key: ApiKey, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on a thread, for a request that writes the caller's batches; the write hook is told
        when it returns or fails."""
        try:
            return await run_in_threadpool(call, *args)
        finally:
            self.writes.wrote(key.org_id)

    async def as_reader(self, request: Request, read: Callable[[ApiKey], T]) -> T:
        """``read(key)`` for a request that only reads, with the key from memory when it was checked
        recently. The key's lookup, if needed, and the read share one hop to a thread; the loop's own executor,
        which costs half what ``run_in_threadpool`` does."""
        keys = self.keys
        authorization = request.headers.get("authorization")
        key = keys.cached(authorization)
        loop = asyncio.get_running_loop()
        if key is not None:
            return await loop.run_in_executor(None, read, _noted(request, key))
        return await loop.run_in_executor(None, lambda: read(_noted(request, keys.for_read(authorization))))

    async def by_plan(self, request: Request, make_plan: Callable[[ApiKey], Plan[T]]) -> T:
        """The answer of the plan ``make_plan(key)`` (``store.compiled``), run without leaving the event
        loop: on SQLite straight on the loop (a local read is cheaper than a hop, see ``reads_are_local``), on
        PostgreSQL on the loop's own connections (``store.async_reads``). Only a key that is not in memory
        goes to a thread to be looked up."""
        authorization = request.headers.get("authorization")
        key = self.keys.cached(authorization)
        if key is None:
            key = await asyncio.get_running_loop().run_in_executor(None, self.keys.for_read, authorization)
        _noted(request, key)
        if self.loop_reads is None:
            return run_plan(self.rt.db, make_plan(key), self._kept_here)
        return await self.loop_reads.run(lambda: make_plan(key))
