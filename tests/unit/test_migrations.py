"""Migrations create exactly the schema of ``store/schema.py``, run in order, and are safe to re-run."""

from __future__ import annotations

import sqlalchemy as sa

from openrelay.store.db import MIGRATIONS, Database
from openrelay.store.schema import metadata
from tests.conftest import BACKEND
from tests.support.server import create_pg_database, drop_pg_database

# SQLite's FTS5 index of q (store/batch_text.py, migration 0020): a virtual table and its shadow tables, which
# schema.py does not declare; test_batch_text.py searches through it.
_SQLITE_TEXT_INDEX = "batch_text"


def _fresh_url(tmp_path) -> tuple[str, bool]:
    if BACKEND == "postgres":
        return create_pg_database(), True
    return f"sqlite:///{tmp_path / 'm.db'}", False


def _columns(engine: sa.Engine) -> dict[str, dict[str, tuple[bool, bool]]]:
    inspector = sa.inspect(engine)
    found = {}
    for table in inspector.get_table_names():
        if table == "schema_migrations" or table.startswith(_SQLITE_TEXT_INDEX):
            continue
        pk = set(inspector.get_pk_constraint(table)["constrained_columns"])
        found[table] = {c["name"]: (bool(c["nullable"]) and c["name"] not in pk, c["name"] in pk)
                        for c in inspector.get_columns(table)}
    return found


def _declared() -> dict[str, dict[str, tuple[bool, bool]]]:
    return {t.name: {c.name: (bool(c.nullable) and not c.primary_key, c.primary_key) for c in t.columns}
            for t in metadata.sorted_tables}


def test_migrations_match_schema_and_rerun(tmp_path):
    url, is_pg = _fresh_url(tmp_path)
    try:
        db = Database(url)
        assert db.migrate() == [v for v, _, _ in MIGRATIONS]
        assert db.migrate() == []  # already applied: nothing runs twice
        assert _columns(db.engine) == _declared()
        inspector = sa.inspect(db.engine)
        for table in metadata.sorted_tables:
            declared = {i.name for i in table.indexes}
            assert declared <= {i["name"] for i in inspector.get_indexes(table.name)}, table.name
        with db.read() as conn:
            versions = conn.execute(sa.text("SELECT version FROM schema_migrations ORDER BY version")).scalars()
            assert list(versions) == sorted(v for v, _, _ in MIGRATIONS)
        db.dispose()
    finally:
        if is_pg:
            drop_pg_database(url)


def test_migration_files_are_numbered_in_order():
    versions = [v for v, _, _ in MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
