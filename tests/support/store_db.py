"""A fresh, migrated store for tests that work on the store's classes directly: a SQLite file in the test's temp
dir, or a database of its own on the PostgreSQL test server (``OPENRELAY_TEST_DB``), dropped afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from openrelay.store.db import Database
from tests.conftest import BACKEND
from tests.support.server import create_pg_database, drop_pg_database

__all__ = ["fresh_database"]


@contextlib.contextmanager
def fresh_database(folder: Path, name: str) -> Iterator[Database]:
    url = create_pg_database() if BACKEND == "postgres" else f"sqlite:///{folder / name}"
    database = Database(url)
    try:
        database.migrate()
        yield database
    finally:
        database.dispose()
        if BACKEND == "postgres":
            drop_pg_database(url)
