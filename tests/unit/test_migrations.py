"""Migrations: a new store gets the baseline and every later version, exactly the schema of ``store/schema.py``, and a
second run does nothing; a store that the migrations before the baseline made (0001 to 0021, kept as they were in
``tests/fixtures/schema_0021``) goes on from there with its rows, to the very schema a new store has; an older
one is refused before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from openrelay.errors import StoreError
from openrelay.store.batch_search import BatchQuery, search
from openrelay.store.batch_text import create_text_index
from openrelay.store.batches import Batches
from openrelay.store.db import BASELINE, MIGRATIONS, Database
from openrelay.store.schema import metadata
from tests.support.store_rows import fresh_url

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "schema_0021"  # tests/fixtures


def _schema(db: Database) -> dict[str, Any]:
    """Everything the store's code relies on, as the database reports it: each table's columns (type, nullable,
    default), primary key, foreign keys and indexes, and SQLite's triggers and virtual tables."""
    inspector = sa.inspect(db.engine)
    found: dict[str, Any] = {}
    for table in sorted(inspector.get_table_names()):
        if table == "schema_migrations":
            continue
        found[table] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"], c.get("default")) for c in
                        inspector.get_columns(table)],
            "pk": inspector.get_pk_constraint(table)["constrained_columns"],
            "fks": sorted((tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                          for f in inspector.get_foreign_keys(table)),
            "indexes": sorted((i["name"], tuple(map(str, i["column_names"])), tuple(i.get("expressions") or ()),
                               bool(i["unique"])) for i in inspector.get_indexes(table)),
            "unique": sorted(tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)),
        }
    if db.is_sqlite:
        with db.read() as conn:
            found["sqlite_master"] = sorted(conn.execute(sa.text(
                "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('trigger', 'table')")).all())
    return found


def _made_before_the_baseline(db: Database) -> None:
    """The store as the code before the baseline made it: each of migrations 0001 to 0021, in its own
    transaction, with the hook that changed the schema (0020's text index; the change notices' triggers of 0010
    and 0015 were dropped again by 0021)."""
    with db.write() as conn:
        conn.execute(sa.text("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(200) NOT NULL, "
                             "applied_at BIGINT NOT NULL)"))
    for path in sorted(FIXTURES.glob("*.sql")):
        version, name = int(path.name[:4]), path.stem[5:]
        with db.write() as conn:
            for statement in _statements(path.read_text()):
                conn.exec_driver_sql(statement)
            if version == 20:
                create_text_index(conn)
            conn.execute(sa.text("INSERT INTO schema_migrations VALUES (:v, :n, 0)"), {"v": version, "n": name})


def _statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _a_batch_as_it_was(db: Database) -> None:
    """An organization, a key and a tagged batch, as the code of schema 0021 wrote them."""
    with db.write() as conn:
        conn.exec_driver_sql("INSERT INTO organizations (id, name, created_at) VALUES ('o1', 'before', 0)")
        conn.exec_driver_sql("INSERT INTO api_keys (id, org_id, key_hash, prefix, scopes, created_at) "
                             "VALUES ('k1', 'o1', 'h', 'p', 'batch.read', 0)")
        conn.exec_driver_sql(
            "INSERT INTO batches (id, org_id, key_id, endpoint, input_file_id, input_blob_key, completion_window, "
            "priority, status, model, created_at, created_ns, expires_at, total, metadata) VALUES ('batch_1', 'o1', "
            "'k1', '/v1/chat/completions', 'f', 'b', '24h', 'standard', 'completed', 'm', 1000, 1, 87400, 2, "
            "'{\"tags\":\"kept,old\"}')")
        conn.exec_driver_sql("INSERT INTO batch_tags (batch_id, org_id, tag, created_ns) VALUES "
                             "('batch_1', 'o1', 'kept', 1), ('batch_1', 'o1', 'old', 1)")


def test_a_new_store_gets_the_schema_of_schema_py_and_a_second_run_does_nothing(tmp_path) -> None:
    with fresh_url(tmp_path) as url:
        db = Database(url)
        assert db.migrate() == [v for v, _, _ in MIGRATIONS]
        assert db.migrate() == []
        found = _schema(db)
        for table in metadata.sorted_tables:
            pk = found[table.name]["pk"]  # SQLite reports a primary key's columns as nullable
            columns = {name: (nullable and name not in pk, name in pk)
                       for name, _type, nullable, _default in found[table.name]["columns"]}
            assert columns == {c.name: (bool(c.nullable) and not c.primary_key, c.primary_key)
                               for c in table.columns}, table.name
        assert set(found) - {"sqlite_master"} <= {t.name for t in metadata.sorted_tables} | {"batch_text"} | {
            f"batch_text_{shadow}" for shadow in ("data", "idx", "content", "docsize", "config")}
        db.dispose()


def test_a_store_made_before_the_baseline_goes_on_from_it_with_its_rows(tmp_path) -> None:
    with fresh_url(tmp_path) as old_url, fresh_url(tmp_path / "new") as new_url:
        old, new = Database(old_url), Database(new_url)
        _made_before_the_baseline(old)
        _a_batch_as_it_was(old)
        assert old.migrate() == [v for v, _, _ in MIGRATIONS if v > BASELINE]
        new.migrate()
        assert _schema(old) == _schema(new)
        assert Batches(old).get("o1", "batch_1").metadata == {"tags": "kept,old"}
        found, _more = search(old, "o1", BatchQuery(tags=("old",), text="kept"), limit=5)
        assert [b.id for b in found] == ["batch_1"]
        old.dispose()
        new.dispose()


def test_a_store_older_than_the_baseline_is_refused_and_left_as_it_was(tmp_path) -> None:
    with fresh_url(tmp_path) as url:
        db = Database(url)
        with db.write() as conn:
            conn.execute(sa.text("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                                 "name VARCHAR(200) NOT NULL, applied_at BIGINT NOT NULL)"))
            conn.execute(sa.text("INSERT INTO schema_migrations VALUES (20, 'year_old_store', 0)"))
        with pytest.raises(StoreError, match="at version 20, before 21"):
            db.migrate()
        assert sa.inspect(db.engine).get_table_names() == ["schema_migrations"]
        db.dispose()


def test_migration_files_are_numbered_in_order_from_the_baseline() -> None:
    versions = [v for v, _, _ in MIGRATIONS]
    assert versions == list(range(BASELINE, BASELINE + len(versions))) and BASELINE == 21
