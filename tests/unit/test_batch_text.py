"""The dashboard's text search (``q``) through its index (store/batch_text.py, migration 0020), on both stores: the
answers are the substring scan's (any case, the id and the metadata's keys and values, LIKE's wildcards taken
literally, texts under 3 characters too), the index follows creates, metadata edits and deletes, and the
search reads it."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
import sqlalchemy as sa

from openrelay.store.accounts import Accounts
from openrelay.store.batch_search import BatchQuery, _filtered, search, summarize
from openrelay.store.batch_text import text_condition
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.retention import Retention
from openrelay.store.schema import batches
from openrelay.types import Batch, BatchStatus
from tests.support.store_rows import fresh_database

METADATA = [{"job": "needle-41", "note": "100% done"}, {"job": "a_b"}, {"job": "aXb", "n": "1000 left"},
            {"path": "x/y"}, {"q": 'quo"te'}, {"p": "back\\slash"}, {"name": "Café Olé"}, None,
            {"tags": "nightly, eval", "owner": "Ana"}]
NEEDLES = ["NEEDLE", "dle-4", "ab", "a", "b", '"job":"a', "100%", "a_b", "x/y", 'quo"te', "back\\sl", "batch_t",
           "TCH_T0", "zzz", "é", "café", "OLÉ", "nightly, e", "ana"]


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        yield database


def _create(db: Database, org_id: str, key_id: str, n: int, metadata: dict[str, str] | None) -> Batch:
    batch = Batch(id=f"batch_t{n:04d}", org_id=org_id, key_id=key_id, endpoint="/v1/chat/completions",
                  input_file_id=f"file-{n}", input_blob_key=f"in/{n}", completion_window="24h", priority="standard",
                  status=BatchStatus.VALIDATING, model="m", created_at=1_000 + n, expires_at=4_000_000_000, total=1,
                  metadata=metadata)
    Batches(db).create(batch, (1_000 + n) * 1_000_000_000, [])
    return batch


def _expected(found: list[Batch], needle: str) -> list[str]:
    """The scan's meaning, in Python: the id, or the metadata's JSON text, holds the needle, any (ASCII) case.
    The needles and texts above fold alike on both stores."""
    spelled = orjson.dumps(needle).decode()[1:-1].lower()
    return [b.id for b in found if needle.lower() in b.id.lower()
            or (b.metadata is not None and spelled in orjson.dumps(b.metadata).decode().lower())]


def _searched(db: Database, org_id: str, needle: str) -> list[str]:
    page, more = search(db, org_id, BatchQuery(text=needle), limit=100)
    assert not more
    assert summarize(db, org_id, BatchQuery(text=needle)).batches == len(page)
    return [b.id for b in page]


def test_indexed_search_answers_as_the_scan_did_through_creates_edits_and_deletes(db: Database) -> None:
    accounts = Accounts(db)
    org, other = accounts.create_org("searched"), accounts.create_org("other")
    key, _ = accounts.create_key(org.id)
    other_key, _ = accounts.create_key(other.id)
    made = [_create(db, org.id, key.id, n, metadata) for n, metadata in enumerate(METADATA)]
    _create(db, other.id, other_key.id, 99, {"job": "needle-41"})  # another organization's: never found
    newest_first = made[::-1]
    for needle in NEEDLES:
        assert _searched(db, org.id, needle) == _expected(newest_first, needle), needle
    assert _searched(db, org.id, "needle") == [made[0].id]

    Batches(db).set_metadata(org.id, made[0].id, {"job": "haystack"})
    assert _searched(db, org.id, "needle") == []
    assert _searched(db, org.id, "HAYST") == [made[0].id]

    with db.write() as conn:  # two batches ended long ago; the retention deletes them
        conn.execute(batches.update().where(batches.c.id.in_([made[0].id, made[6].id])).values(
            status="completed", completed_at=1))
    assert Retention(db).ended_batches(older_than_days=1, limit=10).rows == 2
    assert _searched(db, org.id, "hayst") == []
    assert _searched(db, org.id, "café") == []
    left = [b for b in newest_first if b.id not in (made[0].id, made[6].id)]
    for needle in NEEDLES:
        assert _searched(db, org.id, needle) == _expected(left, needle), needle


def test_a_search_of_three_characters_or_more_reads_the_text_index(db: Database) -> None:
    condition = sa.select(batches.c.id).where(text_condition("needle", is_sqlite=db.is_sqlite))
    sql = str(condition.compile(db.engine, compile_kwargs={"literal_binds": True}))
    with db.read() as conn:
        if db.is_sqlite:
            plan = " ".join(row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
            assert "VIRTUAL TABLE INDEX" in plan and "batch_text" in plan, plan
            short = str(sa.select(batches.c.id).where(text_condition("ne", is_sqlite=True))
                        .compile(db.engine, compile_kwargs={"literal_binds": True}))
            assert "batch_text" not in short  # under a trigram: the scan alone
            # A page starts from the matches, not from the organization's every batch (batch_text.fts_leads).
            source, conditions, _order = _filtered("o", BatchQuery(text="needle"), is_sqlite=True)
            page = str(sa.select(batches.c.id).select_from(source).where(*conditions).order_by(
                batches.c.created_ns.desc()).limit(26).compile(db.engine, compile_kwargs={"literal_binds": True}))
            plan = " ".join(row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + page))
            assert "INTEGER PRIMARY KEY (rowid=?)" in plan and "ix_batches_org" not in plan, plan
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # an empty table: the planner would scan it
            plan = " ".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + sql))
            assert "ix_batches_text_id" in plan and "ix_batches_text_metadata" in plan, plan
