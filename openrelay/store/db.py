"""The store's one reader and writer: a SQLAlchemy engine for SQLite or PostgreSQL, with a sync face (``read``,
``write``) and an async face (``run``), every driver error mapped once (``_driver_errors``); and ordered migrations.
The read path in one page: docs/design.md, "Reading the store".

SQLite runs in WAL mode with a busy timeout, and every write transaction starts ``BEGIN IMMEDIATE`` so two
processes (``orl serve`` and ``orl admin``) never deadlock upgrading a read lock to a write lock. Within one process
the write transactions also queue on a lock of their own: SQLite admits one writer, and a thread that finds the file
locked sleeps in the busy handler (1, 2, 5, 10 ms and on) rather than waking when the writer before it commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from ..clock import now
from ..config import DatabasePool
from ..errors import StoreError, StoreUnavailable, no_such
from .batch_text import create_text_index

__all__ = ["Database", "normalize_url", "in_order_after", "holds_nul", "MIGRATIONS", "BASELINE", "HOOKS"]

T = TypeVar("T")
_WRITE = "openrelay_write"


def normalize_url(url: str) -> str:
    """Accept the URLs operators write (``postgresql://``) and pick our drivers."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


@contextlib.contextmanager
def _driver_errors(*, is_sqlite: bool) -> Iterator[None]:
    """Every driver error as ours, in one place (httpx's ``map_exceptions``): a PostgreSQL server that cannot be
    reached, dropped the connection or did not give one in time (``OperationalError``, a disconnect, the pool's
    timeout) is ``StoreUnavailable`` (503, worth trying again later); anything else ``StoreError``. SQLite's
    OperationalError is a local file's (locked, missing table): no server to wait for."""
    try:
        yield
    except sa.exc.SQLAlchemyError as exc:
        message = f"database error: {exc.__class__.__name__}: {exc}"
        unreachable = isinstance(exc, sa.exc.OperationalError | sa.exc.DisconnectionError | sa.exc.TimeoutError) \
            or getattr(exc, "connection_invalidated", False)
        raise (StoreUnavailable if unreachable and not is_sqlite else StoreError)(message) from exc


def _migration_files() -> list[tuple[int, str, str]]:
    folder = resources.files("openrelay.store.migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found)


MIGRATIONS = _migration_files()
BASELINE = MIGRATIONS[0][0]  # a new store starts here; one made before it holds every version up to it

# What a version does that its SQL cannot do the same way on both stores, run right after that SQL, in its
# transaction, so the version is applied whole or not at all.
HOOKS: dict[int, Callable[[Connection], None]] = {
    21: create_text_index,  # q's index: FTS5 with triggers on SQLite, pg_trgm on PostgreSQL
}


class Database:
    def __init__(self, url: str, pool: DatabasePool = DatabasePool()) -> None:  # noqa: B008 (frozen)
        self.url = normalize_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        # SQLite's one writer, as this process's threads take turns at it (another process still waits in the busy
        # handler). Reentrant: a write inside a write on one thread meets SQLite's own lock, as it did without this.
        self._writer: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self.is_sqlite else contextlib.nullcontext())
        if self.is_sqlite:
            self.engine: Engine = sa.create_engine(
                self.url, connect_args={"timeout": 30, "check_same_thread": False}, pool_size=pool.size,
                max_overflow=pool.overflow, isolation_level=None,
            )
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
        else:
            # A pooled connection the server dropped (a restart) is found by the pre-ping and replaced; a server
            # that is away answers StoreUnavailable within ``pool.connect_seconds``, never hangs.
            self.engine = sa.create_engine(self.url, pool_size=pool.size, max_overflow=pool.overflow,
                                           pool_pre_ping=True, pool_timeout=pool.connect_seconds,
                                           connect_args={"connect_timeout": pool.connect_seconds})

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """The sync face: a read transaction (one snapshot) on a pooled connection."""
        with _driver_errors(is_sqlite=self.is_sqlite), self.engine.connect() as conn, conn.begin():
            yield conn

    async def run(self, read: Callable[..., T], *args: Any) -> T:
        """The async face: ``read(*args)``, a function that reads through ``read()``, for the event loop. It runs
        on the loop's executor (a thread), as procrastinate's sync connectors run their async calls: the loop
        never waits on the driver."""
        return await asyncio.get_running_loop().run_in_executor(None, read, *args)

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: SQLite's ``BEGIN IMMEDIATE``, behind this process's other writers."""
        with _driver_errors(is_sqlite=self.is_sqlite), self._writer, self.engine.connect() as raw:
            conn = raw.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn

    def clock(self, conn: Connection) -> float:
        """Seconds since the epoch by the database's clock. Leases are shared by workers on many machines, so
        they are stamped and compared by this one clock, never by each machine's own."""
        if self.is_sqlite:  # one file, one machine: its clock is the database's
            return float(conn.exec_driver_sql("SELECT (julianday('now') - 2440587.5) * 86400.0").scalar_one())
        return float(conn.exec_driver_sql("SELECT extract(epoch FROM clock_timestamp())").scalar_one())

    def lock_model(self, conn: Connection, model: str) -> None:
        """Serialise slot accounting for one model across every worker process."""
        if self.is_sqlite:
            return  # BEGIN IMMEDIATE already holds the only write lock
        conn.execute(sa.text("INSERT INTO model_locks (model) VALUES (:m) ON CONFLICT DO NOTHING"), {"m": model})
        conn.execute(sa.text("SELECT model FROM model_locks WHERE model = :m FOR UPDATE"), {"m": model})

    def migrate(self) -> list[int]:
        """Apply every migration not yet applied, in order, each in its own transaction with its hook
        (``HOOKS``); safe to race. A store older than ``BASELINE`` is refused: upgrade it first with a release
        that still has the migrations before it (docs/deploy.md, "Upgrades")."""
        applied: list[int] = []
        with self.write() as conn:
            conn.execute(sa.text(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name VARCHAR(200) NOT NULL, applied_at BIGINT NOT NULL)"
            ))
            newest = conn.execute(sa.text("SELECT max(version) FROM schema_migrations")).scalar()
        if newest is not None and newest < BASELINE:
            raise StoreError(f"this store's schema is at version {newest}, before {BASELINE}, where this release's "
                             "migrations start: upgrade it with an earlier release first (docs/deploy.md, Upgrades)")
        for version, name, sql in MIGRATIONS:
            with self.write() as conn:
                if not self.is_sqlite:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(727274)"))
                done = conn.execute(sa.text("SELECT 1 FROM schema_migrations WHERE version = :v"),
                                    {"v": version}).first()
                if done:
                    continue
                for statement in _statements(sql):
                    conn.exec_driver_sql(statement)
                if version in HOOKS:
                    HOOKS[version](conn)
                conn.execute(sa.text("INSERT INTO schema_migrations (version, name, applied_at) "
                                     "VALUES (:v, :n, :t)"), {"v": version, "n": name, "t": now()})
                applied.append(version)
        return applied

    def dispose(self) -> None:
        self.engine.dispose()


def holds_nul(*texts: str | None) -> bool:
    """Whether a text a client sent holds NUL. PostgreSQL refuses such a parameter outright (a driver error,
    which would be a 500), and no stored text holds one on either store, so a lookup by it finds nothing."""
    return any(text is not None and "\x00" in text for text in texts)


def in_order_after(conn: Connection, table: sa.Table, query: sa.Select, *, org_id: str, after: str | None,
                   kind: str, oldest_first: bool = False, param: str = "after") -> sa.Select:
    """``query`` ordered newest first (or oldest first), starting after the row ``after`` (404 naming ``param``
    when the organization has none)."""
    key = sa.tuple_(table.c.created_ns, table.c.id)
    if after:
        anchor = None if holds_nul(after) else conn.execute(
            sa.select(table.c.created_ns, table.c.id).where(table.c.id == after, table.c.org_id == org_id)).first()
        if anchor is None:
            raise no_such(kind, after, param=param)
        query = query.where(key > sa.tuple_(*anchor) if oldest_first else key < sa.tuple_(*anchor))
    if oldest_first:
        return query.order_by(table.c.created_ns, table.c.id)
    return query.order_by(table.c.created_ns.desc(), table.c.id.desc())


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_on_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")
