"""The status vocabulary of types.py as the store applies it: the dashboard's queued/running filters and summary
(store/batch_search.py) and which statuses a cancel moves (store/batches.py). On both stores, rows written
directly so that every status is there at once, the ended ones counted for the summary by the store's own
``count_ended`` (store/ended_counts.py), as a batch's end counts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from openrelay.errors import Conflict
from openrelay.store.batch_search import BatchQuery, search, summarize
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.ended_counts import count_ended
from openrelay.types import CANCELLABLE, SHOWN_QUEUED, SHOWN_RUNNING, BatchStatus
from tests.support.store_rows import fresh_database

# (id, status, in_progress_at): every status once, in_progress both waiting and started.
ROWS = [("b-validating", "validating", None), ("b-queued", "in_progress", None), ("b-running", "in_progress", 5),
        ("b-finalizing", "finalizing", 5), ("b-completed", "completed", 5), ("b-failed", "failed", None),
        ("b-expired", "expired", 5), ("b-cancelling", "cancelling", 5), ("b-cancelled", "cancelled", None)]


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        with database.write() as conn:
            conn.exec_driver_sql("INSERT INTO organizations (id, name, created_at) VALUES ('o1', 'o1', 0)")
            conn.exec_driver_sql("INSERT INTO api_keys (id, org_id, key_hash, prefix, scopes, created_at) "
                                 "VALUES ('k1', 'o1', 'h', 'p', 'batch.read', 0)")
            for n, (batch_id, status, in_progress_at) in enumerate(ROWS):
                conn.execute(sa.text(
                    "INSERT INTO batches (id, org_id, key_id, endpoint, input_file_id, input_blob_key, "
                    "completion_window, priority, status, model, created_at, created_ns, expires_at, total, "
                    "in_progress_at) VALUES (:id, 'o1', 'k1', '/v1/chat/completions', 'f', 'b', '24h', "
                    "'standard', :status, 'm', 0, :ns, 4000000000, 1, :started)"),
                    {"id": batch_id, "status": status, "ns": n, "started": in_progress_at})
            count_ended(conn, [batch_id for batch_id, _, _ in ROWS], sign=1)
        yield database


def _found(db: Database, status: str) -> list[str]:
    found, more = search(db, "o1", BatchQuery(status=status), limit=50)
    assert not more
    return [b.id for b in found]


def test_queued_and_running_split_in_progress_by_whether_its_first_records_started(db: Database) -> None:
    assert _found(db, SHOWN_QUEUED) == ["b-queued"]
    assert _found(db, SHOWN_RUNNING) == ["b-running"]
    assert sorted(_found(db, "in_progress")) == ["b-queued", "b-running"]
    counts = summarize(db, "o1", BatchQuery()).counts
    assert counts == {SHOWN_QUEUED: 1, SHOWN_RUNNING: 1, **{s: 1 for _, s, _ in ROWS if s != "in_progress"}}


def test_a_cancel_moves_exactly_the_cancellable_statuses(db: Database) -> None:
    batches = Batches(db)
    for batch_id, status, _ in ROWS:
        if BatchStatus(status) in CANCELLABLE:
            assert batches.request_cancel("o1", batch_id).status is BatchStatus.CANCELLING
        elif status == "cancelling":
            assert batches.request_cancel("o1", batch_id).status is BatchStatus.CANCELLING  # already on its way
        else:
            with pytest.raises(Conflict):
                batches.request_cancel("o1", batch_id)
