"""PostgreSQL reads on the API's event loop: the plans ``run_plan`` runs on a thread (``store.compiled``) run here on
psycopg's asyncio connections, from a pool of their own, so a poll never leaves the loop; the rows of ``cache_by``
reads are kept between polls (``store.read_cache``). Autocommit, dropped connections and outages: docs/design.md,
"PostgreSQL reads on the event loop"."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy.engine import Dialect

from ..errors import StoreError, StoreUnavailable
from .compiled import FirstRow, Plan
from .db import Database
from .read_cache import POLL_KEPT, POLL_SERVER, KeptRows, ReadCache

__all__ = ["AsyncReads"]

T = TypeVar("T")
log = logging.getLogger("openrelay.store")


class AsyncReads:
    """Plans run on the event loop against PostgreSQL. Open lazily on first use (it needs the running loop);
    ``close`` at shutdown."""

    def __init__(self, db: Database, *, max_size: int = 4, connect_seconds: float = 2.0,
                 keep_rows: bool = True) -> None:
        if db.is_sqlite:
            raise ValueError("AsyncReads is for PostgreSQL; SQLite reads are local (reads_are_local)")
        url = db.engine.url.set(drivername="postgresql")
        self._dialect: Dialect = db.engine.dialect
        self._max_size = max_size
        self._pool = AsyncConnectionPool(
            url.render_as_string(hide_password=False), min_size=1, max_size=max_size, open=False,
            timeout=connect_seconds, kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_seconds))},
            name="openrelay-reads")
        self._opened = False
        self.cache = ReadCache(url.render_as_string(hide_password=False), enabled=keep_rows)

    async def run(self, make_plan: Callable[[], Plan[T]]) -> T:
        """The answer of the plan ``make_plan()`` makes, as ``run_plan`` would give it. ``make_plan`` is called
        again, for a fresh plan, each time a pooled connection turns out to be lost (at most once per
        connection the pool holds, then once on a new one)."""
        lost = 0
        while True:
            plan = make_plan()
            try:
                step = next(plan)
            except StopIteration as done:
                return done.value
            if not self._opened:
                await self._pool.open(wait=False)
                self.cache.start()
                self._opened = True
            try:
                return await self._run(plan, step)
            # No connection could be made in time: the server is away. PoolTimeout is an OperationalError, so it
            # comes first, or it would be taken for a lost connection and waited for again.
            except PoolTimeout as exc:
                raise StoreUnavailable(_message(exc)) from exc
            except psycopg.OperationalError as exc:
                lost += 1
                if exc.sqlstate is not None or lost > self._max_size:  # the server answered (a cancel...)
                    raise StoreUnavailable(_message(exc)) from exc
                # A connection the server dropped (a restart): the pool throws it away; nothing was written, so
                # the plan is read again on the next one.
                log.info("a pooled read connection was lost (%s); reading again", exc)
            except psycopg.Error as exc:
                raise StoreError(_message(exc)) from exc

    async def _run(self, plan: Plan[T], step: FirstRow | Any) -> T:
        cache = self.cache
        async with contextlib.AsyncExitStack() as stack:
            cursor = None  # a pooled connection's, taken at the first step whose rows are not kept
            while True:
                read, params = step.read, step.params
                org_id = params[read.cache_by] if read.cache_by else None
                key = KeptRows.key(read, params) if org_id is not None else None
                kept = False
                if key is not None:
                    kept, rows = cache.get(key, org_id)
                    (POLL_KEPT if kept else POLL_SERVER).inc()
                if not kept:
                    if cursor is None:
                        cursor = (await stack.enter_async_context(self._pool.connection())).cursor()
                    token = cache.token(org_id) if key is not None else None
                    await cursor.execute(*read.sql_and_args(self._dialect, params))
                    rows = await cursor.fetchone() if isinstance(step, FirstRow) else tuple(await cursor.fetchall())
                    if key is not None:
                        cache.put(key, org_id, token, rows)
                try:
                    step = plan.send(rows if isinstance(step, FirstRow) else list(rows))
                except StopIteration as done:
                    return done.value

    async def close(self) -> None:
        if self._opened:
            await self.cache.close()
            await self._pool.close()


def _message(exc: BaseException) -> str:
    return f"database error: {exc.__class__.__name__}: {exc}"
