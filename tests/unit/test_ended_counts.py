"""The dashboard summary's counters of ended batches (store/ended_counts.py, migration 0020) stay equal to a fresh
aggregate over the batches through every transaction that ends, edits or deletes an ended batch, on both stores:
each terminal status a worker writes (completed; failed, as a run's failure and as an early abort, which writes
``failed`` with its errors; expired; cancelled, from cancelling and while finalizing), a metadata edit that moves
an ended batch's tags, and the retention pruning ended batches. A retry makes a new batch by the normal create and
leaves the one it retries ended (service/retry.py): covered here as a create of a batch that is not ended.

Real stores, the store's own transactions (``Batches``, ``Results``, ``Retention``); the server-level path of
each (workers, sweeper) is the one these functions serve, and tests/test_retention.py checks through a real
server that pruning every batch leaves no counter row behind."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pytest
import sqlalchemy as sa

from openrelay.store.accounts import Accounts
from openrelay.store.batch_search import BatchQuery, summarize
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.leases import BatchLeases
from openrelay.store.results import Chunk, Results
from openrelay.store.retention import Retention
from openrelay.store.schema import batch_tags, batches, ended_batch_counts
from openrelay.types import DAY_SECONDS, SHOWN_QUEUED, SHOWN_RUNNING, Batch, BatchStatus, shown_status
from tests.support.store_rows import fresh_database

WORKER = "w-test"
_n = count()


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        yield database


def _create(db: Database, org_id: str, key_id: str, *, model: str = "m/a", priority: str = "standard",
            tags: str | None = None, day: int = 20_000) -> str:
    n = next(_n)
    created = day * DAY_SECONDS + n
    batch = Batch(id=f"batch_c{n:06d}", org_id=org_id, key_id=key_id, endpoint="/v1/chat/completions",
                  input_file_id=f"file-{n}", input_blob_key=f"in/{n}", completion_window="24h", priority=priority,
                  status=BatchStatus.VALIDATING, model=model, created_at=created, expires_at=4_000_000_000,
                  total=4, metadata={"job": f"j{n}", **({"tags": tags} if tags else {})})
    Batches(db).create(batch, created * 1_000_000_000, [])
    return batch.id


def _run(db: Database, batch_id: str, key_id: str, *, records: int = 2) -> None:
    """Claim the batch (alone in its queue) and commit a chunk of ``records`` settled records."""
    store = BatchLeases(db)
    claimed = store.claim(WORKER, {"m/a": 100, "m/b": 100}, 60.0)
    assert claimed is not None and claimed.id == batch_id
    store.mark_running(batch_id, WORKER, None)
    Results(db).commit_chunk(batch_id, WORKER, key_id, Chunk(
        seq=0, out_key=f"o/{batch_id}", err_key=None, lines=list(range(1, records + 1)), completed=records,
        failed=0, input_tokens=100 * records, output_tokens=10 * records, cost_nano_usd=7 * records))


def _end(db: Database, batch_id: str, org_id: str, status: BatchStatus, **extra: object) -> None:
    Results(db).finalize(batch_id, WORKER, status=status, output=None, error=None, org_id=org_id, unrun=2,
                         **extra)  # type: ignore[arg-type]


def _fresh(db: Database, org_id: str, query: BatchQuery) -> dict[str, tuple[int, int, int, int]]:
    """The summary as an aggregate over every matching batch, written independently of the store's code."""
    b = batches.c
    where = [b.org_id == org_id]
    if query.status in (SHOWN_QUEUED, SHOWN_RUNNING):
        where += [b.status == "in_progress",
                  b.in_progress_at.is_(None) if query.status == SHOWN_QUEUED else b.in_progress_at.is_not(None)]
    elif query.status:
        where.append(b.status == query.status)
    for column, value in ((b.model, query.model), (b.priority, query.priority)):
        if value:
            where.append(column == value)
    for tag in query.tags:
        where.append(b.id.in_(sa.select(batch_tags.c.batch_id).where(batch_tags.c.tag == tag)))
    if query.created_from is not None:
        where.append(b.created_at >= query.created_from)
    if query.created_to is not None:
        where.append(b.created_at < query.created_to)
    found: dict[str, tuple[int, int, int, int]] = {}
    with db.read() as conn:
        for row in conn.execute(sa.select(b.status, b.in_progress_at, b.input_tokens, b.output_tokens,
                                          b.cost_nano_usd).where(*where)):
            shown = shown_status(row.status, row.in_progress_at)
            n, i, o, c = found.get(shown, (0, 0, 0, 0))
            found[shown] = (n + 1, i + row.input_tokens, o + row.output_tokens, c + row.cost_nano_usd)
    return found


QUERIES = [BatchQuery(), BatchQuery(status="completed"), BatchQuery(status="failed"), BatchQuery(status="expired"),
           BatchQuery(status="cancelled"), BatchQuery(status=SHOWN_QUEUED), BatchQuery(status=SHOWN_RUNNING),
           BatchQuery(status="cancelling"), BatchQuery(model="m/b"), BatchQuery(priority="expedited"),
           BatchQuery(tags=("red",)), BatchQuery(tags=("blue",)), BatchQuery(tags=("red",), status="completed"),
           BatchQuery(tags=("red", "blue")), BatchQuery(created_from=20_001 * DAY_SECONDS),
           BatchQuery(created_from=20_000 * DAY_SECONDS, created_to=20_001 * DAY_SECONDS),
           BatchQuery(model="m/a", priority="standard", tags=("blue",), created_to=20_002 * DAY_SECONDS)]


def _assert_summaries_fresh(db: Database, org_id: str) -> None:
    for query in QUERIES:
        summary = summarize(db, org_id, query)
        fresh = _fresh(db, org_id, query)
        assert summary.counts == {shown: n for shown, (n, _, _, _) in fresh.items()}, query
        assert (summary.input_tokens, summary.output_tokens, summary.cost_nano_usd) == tuple(
            sum(v[i] for v in fresh.values()) for i in (1, 2, 3)), query


def test_every_transaction_that_ends_edits_or_prunes_an_ended_batch_keeps_the_summary_fresh(db: Database) -> None:
    accounts = Accounts(db)
    org = accounts.create_org("counted")
    key, _secret = accounts.create_key(org.id)
    other = accounts.create_org("other")  # its batches must never show in the first's summary
    other_key, _ = accounts.create_key(other.id)
    o, k = org.id, key.id

    def ended(status: BatchStatus, **made: object) -> str:
        batch_id = _create(db, o, k, **made)  # type: ignore[arg-type]
        _run(db, batch_id, k)
        _end(db, batch_id, o, status)
        return batch_id

    completed = ended(BatchStatus.COMPLETED, tags="red, blue")
    ended(BatchStatus.COMPLETED, model="m/b", priority="expedited", tags="red", day=20_001)
    ended(BatchStatus.FAILED, tags="blue")
    ended(BatchStatus.EXPIRED, day=20_001)
    aborted = _create(db, o, k, tags="red")  # the early abort: failed, with the rule's error
    _run(db, aborted, k)
    _end(db, aborted, o, BatchStatus.FAILED, errors=[{"code": "failure_threshold_exceeded", "message": "x"}])
    cancelled = _create(db, o, k, tags="blue")
    _run(db, cancelled, k)
    Batches(db).request_cancel(o, cancelled)
    _assert_summaries_fresh(db, o)  # cancelling: not ended, counted live
    _end(db, cancelled, o, BatchStatus.CANCELLED)
    while_finalizing = _create(db, o, k, model="m/b")
    _run(db, while_finalizing, k, records=4)  # every record has its line: the run's end moves it on
    assert BatchLeases(db).end_run(while_finalizing, WORKER, may_complete=True).status is BatchStatus.FINALIZING
    Batches(db).request_cancel(o, while_finalizing)
    _end(db, while_finalizing, o, BatchStatus.COMPLETED)  # cancelled while finalizing: written as cancelled
    assert Batches(db).get(o, while_finalizing).status is BatchStatus.CANCELLED
    running = _create(db, o, k, tags="red")
    _run(db, running, k)
    _create(db, o, k, tags="red, blue")  # queued by the claim below (no slot to run it); as a retry's new batch is
    assert BatchLeases(db).claim(WORKER, {"m/a": 0, "m/b": 0}, 60.0) is None
    _create(db, o, k)  # validating
    noise = _create(db, other.id, other_key.id, tags="red")
    _run(db, noise, other_key.id)
    _end(db, noise, other.id, BatchStatus.COMPLETED)
    _assert_summaries_fresh(db, o)

    Batches(db).set_metadata(o, completed, {"tags": "blue,green"})  # an ended batch's tags move
    Batches(db).set_metadata(o, running, {"tags": "blue"})  # a live one's: no counter changes
    _assert_summaries_fresh(db, o)
    assert summarize(db, o, BatchQuery(tags=("green",))).counts == {"completed": 1}

    with db.write() as conn:  # three of the ended batches ended long ago: the retention prunes them
        conn.execute(batches.update().where(batches.c.id.in_([completed, aborted, cancelled])).values(
            completed_at=1, failed_at=1, cancelled_at=1))
    pruned = Retention(db).ended_batches(older_than_days=30, limit=100)
    assert pruned.rows == 3
    _assert_summaries_fresh(db, o)
    assert summarize(db, o, BatchQuery(tags=("green",))).counts == {}

    with db.write() as conn:  # every other ended batch too: no counter row is left behind
        conn.execute(batches.update().where(batches.c.status.in_(["completed", "failed", "expired", "cancelled"]))
                     .values(completed_at=1, failed_at=1, expired_at=1, cancelled_at=1))
    Retention(db).ended_batches(older_than_days=30, limit=100)
    _assert_summaries_fresh(db, o)
    with db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(ended_batch_counts)).scalar_one() == 0


def test_the_summary_reads_counters_not_every_ended_batch(db: Database) -> None:
    """Counters that disagree with the rows show in the summary: it reads them, not an aggregate of the ended
    batches (which would still say 1)."""
    accounts = Accounts(db)
    org = accounts.create_org("read")
    key, _ = accounts.create_key(org.id)
    batch_id = _create(db, org.id, key.id)
    _run(db, batch_id, key.id)
    _end(db, batch_id, org.id, BatchStatus.COMPLETED)
    assert summarize(db, org.id, BatchQuery()).counts == {"completed": 1}
    with db.write() as conn:
        conn.execute(ended_batch_counts.update().values(batches=41))
    assert summarize(db, org.id, BatchQuery()).counts == {"completed": 41}
    # Filters the counters cannot answer read the matching rows.
    assert summarize(db, org.id, BatchQuery(text="batch_c")).counts == {"completed": 1}
