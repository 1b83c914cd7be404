"""What a store holds, read straight from it: rows per table, and the blobs' count and bytes (a local directory or
an S3 prefix). The retention tests and bench/bench_retention.py compare these with a baseline."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import sqlalchemy as sa

from openrelay.store.db import Database, normalize_url
from openrelay.store.schema import metadata
from tests.conftest import BACKEND
from tests.support.server import create_pg_database, drop_pg_database

__all__ = ["table_rows", "local_blobs", "s3_blobs", "rows_where", "insert_running_batch", "fresh_url", "fresh_database"]


# State bounded by organizations x models, not by the batches run, and never pruned: each organization's fair-share
# turn per model (store/fair_share.py), each model's lock row (made by the first claim that locks the model, whenever
# a worker's tick comes: store/db.py) and what a limiter learnt per model and replica (store/engine_limits.py). So
# it is no part of what comes back to a baseline.
KEPT_PER_MODEL = frozenset({"model_shares", "model_locks", "engine_limits"})


def table_rows(database_url: str) -> dict[str, int]:
    """Rows in every table of the schema, by name, but those ``KEPT_PER_MODEL``."""
    engine = sa.create_engine(normalize_url(database_url))
    try:
        with engine.connect() as conn:
            return {str(t.name): conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                    for t in metadata.sorted_tables if t.name not in KEPT_PER_MODEL}
    finally:
        engine.dispose()


def rows_where(database_url: str, table: str, **equal: Any) -> list[dict[str, Any]]:
    """The rows of ``table`` whose columns equal ``equal``, as dicts."""
    engine = sa.create_engine(normalize_url(database_url))
    t = metadata.tables[table]
    try:
        with engine.connect() as conn:
            query = sa.select(t).where(*(t.c[name] == value for name, value in equal.items()))
            return [dict(row._mapping) for row in conn.execute(query)]
    finally:
        engine.dispose()


def local_blobs(folder: Path) -> dict[str, int]:
    """Every blob under a local blob directory: key -> bytes. A folder or blob deleted while it is walked (the
    sweeper at work) is left out, not an error."""
    found: dict[str, int] = {}
    for parent, _folders, names in os.walk(folder):
        for name in names:
            path = Path(parent) / name
            with contextlib.suppress(FileNotFoundError):
                found[str(path.relative_to(folder))] = path.stat().st_size
    return found


def s3_blobs(store: Any, prefix: str) -> dict[str, int]:
    """Every object under ``prefix`` of an obstore S3 store: key -> bytes."""
    return {meta["path"]: meta["size"] for batch in obstore.list(store, prefix=prefix) for meta in batch}


def insert_running_batch(conn: sa.Connection, *, batch_id: str, org_id: str, key_id: str, created_ns: int = 0,
                         lease_owner: str | None = None) -> None:
    """A batch row in progress, written straight (no change notice): for tests and benchmarks of the write path
    that take it from there (``store/leases.py``, ``store/results.py``)."""
    conn.execute(sa.text(
        "INSERT INTO batches (id, org_id, key_id, endpoint, input_file_id, input_blob_key, completion_window, "
        "priority, status, model, created_at, created_ns, expires_at, total, completed, failed, rejected_count, "
        "input_tokens, output_tokens, cost_nano_usd, started, run_failures, lease_owner, lease_expires_at) "
        "VALUES (:id, :org, :key, '/v1/chat/completions', 'f', 'k', '24h', 'standard', 'in_progress', 'm', 0, :ns, "
        "4000000000, 10, 0, 0, 0, 0, 0, 0, true, 0, :owner, :lease)"),
        {"id": batch_id, "org": org_id, "key": key_id, "ns": created_ns, "owner": lease_owner,
         "lease": None if lease_owner is None else 4e9})


@contextlib.contextmanager
def fresh_url(tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty store of the suite's backend: a SQLite file under ``tmp_path``, or a PostgreSQL
    database dropped after."""
    if BACKEND != "postgres":
        tmp_path.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@contextlib.contextmanager
def fresh_database(tmp_path: Path) -> Iterator[Database]:
    """A new store of the suite's backend (``fresh_url``), migrated."""
    with fresh_url(tmp_path) as url:
        database = Database(url)
        try:
            database.migrate()
            yield database
        finally:
            database.dispose()
