"""Reads on the polling path, compiled once per dialect and run straight on the driver, written as plans: a
generator that yields its steps (``FirstRow``, ``AllRows``), is sent each step's rows and returns its answer.
``run_plan`` runs one on a thread; ``store/async_reads.py`` on the event loop. Why, and what it costs: docs/design.md,
"Reads on the polling path"."""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..errors import StoreError, StoreUnavailable
from .db import Database, database_error
from .read_cache import POLL_KEPT, POLL_SERVER, KeptRows

__all__ = ["AllRows", "CompiledRead", "FirstRow", "Plan", "Reader", "reader", "reads_are_local", "run_plan"]

T = TypeVar("T")


class CompiledRead:
    """One Core SELECT, with its bound parameters named by ``sa.bindparam``; compiled on first use per dialect.

    ``cache_by`` names the parameter holding an organization's id when the read's rows depend only on that
    organization's rows of ``batches`` and ``batch_tags``: the API may then reuse them until a change of that
    organization is announced (``store.read_cache``)."""

    def __init__(self, statement: sa.Select[Any], *, cache_by: str | None = None) -> None:
        self.statement = statement
        self.cache_by = cache_by
        self._compiled: dict[str, tuple[str, dict[str, Any], tuple[str, ...] | None]] = {}

    def sql_and_args(self, dialect: Dialect, params: Mapping[str, Any]) -> tuple[str, Any]:
        found = self._compiled.get(dialect.name)
        if found is None:
            compiled = self.statement.compile(dialect=dialect)
            order = tuple(compiled.positiontup or ()) if dialect.positional else None
            found = (str(compiled), dict(compiled.params), order)
            self._compiled[dialect.name] = found
        sql, defaults, order = found
        values = {**defaults, **params} if defaults else params
        if order is None:
            return sql, values
        return sql, tuple(values[name] for name in order)


@dataclass(frozen=True, slots=True)
class FirstRow:
    """A plan's step: the first row of ``read`` (a tuple), or None."""

    read: CompiledRead
    params: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AllRows:
    """A plan's step: every row of ``read``, a list of tuples."""

    read: CompiledRead
    params: Mapping[str, Any]


# A read as steps: yields FirstRow/AllRows, is sent each one's rows, returns the answer. It may raise (NotFound...).
Plan = Generator[FirstRow | AllRows, Any, T]


class Reader:
    """A few reads on one pooled driver connection."""

    def __init__(self, dialect: Dialect, cursor: Any, serial: int = 0) -> None:
        self._dialect = dialect
        self._cursor = cursor
        self._serial = serial

    def first(self, read: CompiledRead, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        self._cursor.execute(*read.sql_and_args(self._dialect, params))
        return self._cursor.fetchone()

    def all(self, read: CompiledRead, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        self._cursor.execute(*read.sql_and_args(self._dialect, params))
        return self._cursor.fetchall()

    def step(self, step: FirstRow | AllRows) -> Any:
        if isinstance(step, FirstRow):
            return self.first(step.read, step.params)
        return self.all(step.read, step.params)

    def data_version(self) -> tuple[int, int]:
        """(this connection's serial, SQLite's ``data_version`` on it): the version changes when any other
        connection commits to the file (this one only reads). A version means something only on the connection
        that gave it, and a thread's connection is replaced after an error, so the serial, never reused, goes
        with it."""
        self._cursor.execute("PRAGMA data_version")
        return self._serial, self._cursor.fetchone()[0]


def run_plan(db: Database, plan: Plan[T], kept: KeptRows | None = None) -> T:
    """Run ``plan`` here, on this thread's reader. A plan that needs no read (a refusal) takes no connection.

    With ``kept`` (SQLite only, one thread's), the rows of reads marked ``cache_by`` are reused while SQLite's
    ``data_version`` says no connection, of this process or another, has committed since they were read: one
    PRAGMA per plan instead of its SELECTs. Rows read after the PRAGMA are at least as new as its version, and
    any later commit changes it."""
    try:
        step = next(plan)
    except StopIteration as done:
        return done.value
    with reader(db) as read:
        version = read.data_version() if kept is not None else None
        while True:
            key = KeptRows.key(step.read, step.params) if version is not None and step.read.cache_by else None
            if key is not None:
                found, rows = kept.get(key, version)
                (POLL_KEPT if found else POLL_SERVER).inc()
                if not found:
                    rows = read.step(step)
                    kept.put(key, version, rows if isinstance(step, FirstRow) else tuple(rows))
                elif not isinstance(step, FirstRow):
                    rows = list(rows)
            else:
                rows = read.step(step)
            try:
                step = plan.send(rows)
            except StopIteration as done:
                return done.value


def reads_are_local(db: Database) -> bool:
    """Whether a read may run on the event loop. SQLite: a read takes microseconds from the OS page cache and,
    in WAL mode, never waits for a writer (writers append to the log; readers keep their snapshot), which is less
    than a hop to a thread costs. PostgreSQL is a socket away: the loop must not wait on it, so its plans run on
    asyncio connections (``store.async_reads``)."""
    return db.is_sqlite


@contextlib.contextmanager
def reader(db: Database) -> Iterator[Reader]:
    """A ``Reader`` on SQLite's connection for this thread, or on a pooled PostgreSQL connection."""
    if db.is_sqlite:
        with _sqlite_reader(db) as found:
            yield found
        return
    engine = db.engine
    try:
        conn = engine.raw_connection()
    except sa.exc.SQLAlchemyError as exc:
        raise database_error(exc, is_sqlite=False) from exc
    driver = conn.dbapi_connection
    try:
        driver.autocommit = True
        cursor = conn.cursor()
        try:
            yield Reader(engine.dialect, cursor)
        finally:
            cursor.close()
    except engine.dialect.loaded_dbapi.Error as exc:
        message = f"database error: {exc.__class__.__name__}: {exc}"
        if engine.dialect.is_disconnect(exc, driver, None):
            conn.invalidate(exc)
            raise StoreUnavailable(message) from exc
        if isinstance(exc, engine.dialect.loaded_dbapi.OperationalError):
            raise StoreUnavailable(message) from exc
        raise StoreError(message) from exc
    finally:
        if conn.dbapi_connection is not None:
            try:
                conn.dbapi_connection.autocommit = False
            except engine.dialect.loaded_dbapi.Error as exc:
                conn.invalidate(exc)  # never back in the pool in autocommit mode
        conn.close()


# SQLite reads use one connection per thread, kept out of the pool: the event loop's reads can never wait for a
# pooled connection that writers hold, and none pays the pool's checkout and reset. A thread's connection is
# closed when the thread ends (its thread-local goes) or after an error.
_per_thread: weakref.WeakKeyDictionary[Database, threading.local] = weakref.WeakKeyDictionary()
_per_thread_lock = threading.Lock()
_serials = itertools.count(1)  # each reader connection's, for ``Reader.data_version``


@contextlib.contextmanager
def _sqlite_reader(db: Database) -> Iterator[Reader]:
    local = _per_thread.get(db)
    if local is None:
        with _per_thread_lock:
            local = _per_thread.setdefault(db, threading.local())
    driver = getattr(local, "driver", None)
    if driver is None:
        try:
            fairy = db.engine.raw_connection()  # made by the engine, so its connect hook ran (WAL, busy timeout)
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc.__class__.__name__}: {exc}") from exc
        fairy.detach()
        driver = local.driver = fairy.dbapi_connection
        local.serial = next(_serials)
    try:
        cursor = driver.cursor()
        try:
            yield Reader(db.engine.dialect, cursor, local.serial)
        finally:
            cursor.close()
    except db.engine.dialect.loaded_dbapi.Error as exc:
        local.driver = None
        with contextlib.suppress(db.engine.dialect.loaded_dbapi.Error):
            driver.close()
        raise StoreError(f"database error: {exc.__class__.__name__}: {exc}") from exc
