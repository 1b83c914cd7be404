"""Which index the dashboard's page and summary walk under tag filters (store/batch_search.py ``_walk``), on both
stores: the rarest tag's range rather than the first tag given, and the organization's status (or model) index when
the counters say that filter keeps fewer batches than the tag; and the answers, pages and summaries alike, are the
same whichever is walked.

The ended batches are written by the store's own functions: created by ``Batches.create``, then moved to their
terminal status and counted by ``ended_counts.count_ended`` in one transaction, as ``Results._finalize`` does (the
full worker path is tests/unit/test_ended_counts.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pytest
import sqlalchemy as sa

from openrelay.store.accounts import Accounts
from openrelay.store.batch_search import BatchQuery, _filtered, _walk, search, summarize
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.ended_counts import count_ended
from openrelay.store.schema import batches
from openrelay.types import SHOWN_QUEUED, Batch, BatchStatus
from tests.support.store_rows import fresh_database

_n = count()


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        yield database


def _batches(db: Database, org_id: str, key_id: str, made: int, *, tags: str, status: str = "completed",
             model: str = "m/a") -> None:
    ids = []
    for _ in range(made):
        n = next(_n)
        batch = Batch(id=f"batch_w{n:05d}", org_id=org_id, key_id=key_id, endpoint="/v1/chat/completions",
                      input_file_id=f"file-{n}", input_blob_key=f"in/{n}", completion_window="24h",
                      priority="standard", status=BatchStatus.VALIDATING, model=model, created_at=1_000 + n,
                      expires_at=4_000_000_000, total=1, metadata={"tags": tags} if tags else None)
        Batches(db).create(batch, (1_000 + n) * 1_000_000_000, [])
        ids.append(batch.id)
    if status != "validating":
        with db.write() as conn:
            conn.execute(batches.update().where(batches.c.id.in_(ids)).values(
                status=status, input_tokens=10, output_tokens=3, cost_nano_usd=7))
            count_ended(conn, ids, sign=1)


@pytest.fixture
def org(db: Database) -> str:
    """common on 12 completed batches and 2 failed ones; rare on 2 of the completed; model m/b on 3 batches."""
    accounts = Accounts(db)
    made = accounts.create_org("walked")
    key, _ = accounts.create_key(made.id)
    _batches(db, made.id, key.id, 8, tags="common")
    _batches(db, made.id, key.id, 2, tags="common, rare")
    _batches(db, made.id, key.id, 2, tags="common", status="failed")
    _batches(db, made.id, key.id, 2, tags="common", model="m/b")
    _batches(db, made.id, key.id, 1, tags="other", model="m/b")
    _batches(db, made.id, key.id, 3, tags="common", status="validating")  # not ended: not counted
    other = accounts.create_org("noise")  # its counters must not sway the choice
    other_key, _ = accounts.create_key(other.id)
    _batches(db, other.id, other_key.id, 5, tags="rare", status="failed")
    return made.id


def test_the_rarest_filter_is_walked(db: Database, org: str) -> None:
    with db.read() as conn:
        assert _walk(conn, org, BatchQuery(tags=("common", "rare"))) == ("rare", "common")
        assert _walk(conn, org, BatchQuery(tags=("rare", "common"))) == ("rare", "common")
        assert _walk(conn, org, BatchQuery(tags=("common", "none"))) == ("none", "common")
        assert _walk(conn, org, BatchQuery(tags=("common",), status="failed")) == ()  # 2 failed < 14 common
        assert _walk(conn, org, BatchQuery(tags=("common",), status=SHOWN_QUEUED)) == ()  # live: none ended
        assert _walk(conn, org, BatchQuery(tags=("common",), model="m/b")) == ()  # 3 < 14
        assert _walk(conn, org, BatchQuery(tags=("rare",), status="completed")) == ("rare",)  # 2 < 12
        assert _walk(conn, org, BatchQuery(tags=("rare",), status="failed")) == ("rare",)  # a tie: the tag
        assert _walk(conn, org, BatchQuery(tags=("common",), status="completed", model="m/b")) == ()
        assert _walk(conn, org, BatchQuery(status="failed")) == ()


def _plan(db: Database, org: str, query: BatchQuery) -> tuple[str, str]:
    """The page's statement as ``search`` builds it, with its values, and its plan."""
    with db.read() as conn:
        source, conditions, order = _filtered(org, query, is_sqlite=db.is_sqlite, walk=_walk(conn, org, query))
        page = str(sa.select(batches.c.id).select_from(source).where(*conditions)
                   .order_by(*(column.desc() for column in order)).limit(26)
                   .compile(db.engine, compile_kwargs={"literal_binds": True}))
        if db.is_sqlite:
            return page, " ".join(row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + page))
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # small tables: the planner would scan them
        return page, " ".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + page))


def test_a_page_starts_from_the_rarest_tag_or_from_the_rarer_status(db: Database, org: str) -> None:
    page, _ = _plan(db, org, BatchQuery(tags=("common", "rare")))
    assert "batch_tags.tag = 'rare'" in page and "also_tagged_0.tag = 'common'" in page, page
    page, plan = _plan(db, org, BatchQuery(tags=("common",), status="failed"))
    assert "ix_batches_org_status_order" in plan and "ix_batch_tags_org_tag_order" not in plan, plan
    page, plan = _plan(db, org, BatchQuery(tags=("rare",), status="completed"))
    assert "batch_tags.tag = 'rare'" in page and "ix_batch_tags_org_tag_order" in plan, plan


QUERIES = [BatchQuery(tags=("common", "rare")), BatchQuery(tags=("rare", "common")),
           BatchQuery(tags=("common", "none")), BatchQuery(tags=("common",), status="failed"),
           BatchQuery(tags=("common",), status="completed"),
           BatchQuery(tags=("common",), status=SHOWN_QUEUED), BatchQuery(tags=("common",), status="validating"),
           BatchQuery(tags=("common", "rare"), status="completed"), BatchQuery(tags=("common",), model="m/b"),
           BatchQuery(tags=("common", "other"), model="m/b"), BatchQuery(tags=("rare",), status="failed"),
           BatchQuery(tags=("common",), status="failed", text="batch_w"),
           BatchQuery(tags=("common", "rare"), created_from=1_003, created_to=1_020)]


def _walked(db: Database, org: str, query: BatchQuery, walk: tuple[str, ...]) -> list[str]:
    """Every batch the filters keep, newest first, walking ``walk``'s tags (none: the organization's index)."""
    with db.read() as conn:
        source, conditions, _order = _filtered(org, query, is_sqlite=db.is_sqlite, walk=walk)
        return list(conn.execute(sa.select(batches.c.id).select_from(source).where(*conditions)
                                 .order_by(batches.c.created_ns.desc())).scalars())


def test_the_answers_do_not_depend_on_what_is_walked(db: Database, org: str) -> None:
    """Each query's pages (2 rows each, through ``after``) and summary, as chosen, equal what every other walk
    finds: each tag's range first, and the organization's index."""
    with db.read() as conn:
        ended = set(conn.execute(sa.select(batches.c.id).where(batches.c.input_tokens > 0)).scalars())
    for query in QUERIES:
        expected = _walked(db, org, query, ())
        for tag in query.tags:
            assert _walked(db, org, query, (tag, *(t for t in query.tags if t != tag))) == expected, (query, tag)
        found, after = [], None
        while True:
            page, more = search(db, org, query, limit=2, after=after)
            found += [b.id for b in page]
            if not more:
                break
            after = page[-1].id
        assert found == expected, query
        summary = summarize(db, org, query)
        assert (summary.batches, summary.input_tokens) == (len(found), 10 * len(ended.intersection(found))), query
    assert _walked(db, org, BatchQuery(tags=("common",), status="failed"), ())
    assert len(_walked(db, org, BatchQuery(tags=("common", "rare")), ())) == 2
