"""The lifecycle's transitions as the store applies them (openrelay/lifecycle.py): every change of status is guarded
by the statuses it starts from, so the database refuses a move the lifecycle does not hold, whatever the caller
asks. On both stores, rows written directly in every status with this worker's lease, then ended every way. And
``decide_end``'s order, case by case."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from openrelay.lifecycle import End, TransitionRefused, decide_end
from openrelay.store.db import Database
from openrelay.store.leases import BatchLeases
from openrelay.store.results import LeaseLost, Results
from openrelay.store.schema import batches
from openrelay.types import BatchStatus
from tests.support.store_rows import fresh_database

STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
# Written out rather than read from lifecycle.py: what each end may start from, and the status it then has.
ENDS_FROM = {
    "completed": {"in_progress": "completed", "finalizing": "completed", "cancelling": "cancelled"},
    "cancelled": {"cancelling": "cancelled"},
    "expired": {"in_progress": "expired", "finalizing": "expired", "cancelling": "expired"},
    "failed": {"in_progress": "failed", "finalizing": "failed", "cancelling": "failed"},
}
_created = itertools.count()


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        with database.write() as conn:
            conn.exec_driver_sql("INSERT INTO organizations (id, name, created_at) VALUES ('o1', 'o1', 0)")
            conn.exec_driver_sql("INSERT INTO api_keys (id, org_id, key_hash, prefix, scopes, created_at) "
                                 "VALUES ('k1', 'o1', 'h', 'p', 'batch.read', 0)")
        yield database


def _insert(db: Database, batch_id: str, status: str, *, completed: int = 1) -> None:
    """A batch of 3 records, ``completed`` of them with their lines, held by worker ``w``."""
    with db.write() as conn:
        conn.execute(sa.text(
            "INSERT INTO batches (id, org_id, key_id, endpoint, input_file_id, input_blob_key, completion_window, "
            "priority, status, model, created_at, created_ns, expires_at, total, completed, lease_owner, "
            "lease_expires_at) VALUES (:id, 'o1', 'k1', '/v1/chat/completions', 'f', 'b', '24h', 'standard', "
            ":status, 'm', 0, :ns, 4000000000, 3, :completed, 'w', 9999999999)"),
            {"id": batch_id, "status": status, "ns": next(_created), "completed": completed})


def _row(db: Database, batch_id: str) -> tuple[str, str | None, int]:
    with db.read() as conn:
        row = conn.execute(sa.select(batches.c.status, batches.c.lease_owner, batches.c.failed)
                           .where(batches.c.id == batch_id)).one()
    return row.status, row.lease_owner, row.failed


def test_an_end_moves_only_the_statuses_it_starts_from_and_the_database_refuses_the_rest(db: Database) -> None:
    results = Results(db)
    for end, moves in ENDS_FROM.items():
        for status in STATUSES:
            batch_id = f"b-{status}-{end}"
            _insert(db, batch_id, status)
            if status in moves:
                results.finalize(batch_id, "w", status=BatchStatus(end), output=None, error=None, org_id="o1",
                                 unrun=2)
                assert _row(db, batch_id) == (moves[status], None, 2), (status, end)  # the 2 unrun count as failed
            else:
                with pytest.raises(TransitionRefused):
                    results.finalize(batch_id, "w", status=BatchStatus(end), output=None, error=None, org_id="o1",
                                     unrun=2)
                assert _row(db, batch_id) == (status, "w", 0), (status, end)  # unchanged, the lease still held


def test_an_end_without_the_lease_is_a_lost_lease_and_an_expiry_with_nothing_unrun_completes(db: Database) -> None:
    results = Results(db)
    _insert(db, "b-other", "in_progress")
    with pytest.raises(LeaseLost):
        results.finalize("b-other", "v", status=BatchStatus.EXPIRED, output=None, error=None, org_id="o1", unrun=2)
    assert _row(db, "b-other") == ("in_progress", "w", 0)
    _insert(db, "b-late", "in_progress", completed=3)
    results.finalize("b-late", "w", status=BatchStatus.EXPIRED, output=None, error=None, org_id="o1", unrun=0)
    assert _row(db, "b-late") == ("completed", None, 0)  # the window passed after the last record got its line


def test_a_run_moves_to_finalizing_only_from_in_progress_with_every_record_lined(db: Database) -> None:
    leases = BatchLeases(db)
    for status in STATUSES:
        _insert(db, f"b-{status}", status, completed=3)
        assert leases.end_run(f"b-{status}", "w", may_complete=True).status.value == (
            "finalizing" if status == "in_progress" else status)
    _insert(db, "b-unlined", "in_progress", completed=2)
    assert leases.end_run("b-unlined", "w", may_complete=True).status is BatchStatus.IN_PROGRESS
    _insert(db, "b-aborted", "in_progress", completed=3)
    assert leases.end_run("b-aborted", "w", may_complete=False).status is BatchStatus.IN_PROGRESS


@pytest.mark.parametrize(("status", "facts", "end"), [
    ("cancelling", {"aborted": True, "past_window": True}, End.CANCELLED),  # a cancel comes first
    ("in_progress", {"aborted": True, "past_window": True}, End.ABORTED),  # then the failure_threshold
    ("finalizing", {"runs_failed": True}, End.FAILED),  # then runs that kept failing, even while finalizing
    ("in_progress", {"runs_failed": True, "past_window": True}, End.EXPIRED),
    ("finalizing", {"past_window": True, "model_offered": False}, End.COMPLETED),  # every record has its line
    ("in_progress", {"past_window": True, "model_offered": False}, End.FAILED),  # its model left the catalog
    ("in_progress", {"past_window": True}, End.EXPIRED),
    ("in_progress", {}, None),  # records to run: it runs (or, after a run, is handed back or tried again)
])
def test_how_a_batch_ends_is_decided_in_one_order(status: str, facts: dict[str, bool], end: End | None) -> None:
    facts = {"past_window": False, **facts}
    assert decide_end(BatchStatus(status), **facts) is end


def test_every_unrun_code_and_its_lines() -> None:
    assert {e.name: e.unrun_code for e in End} == {
        "COMPLETED": None, "CANCELLED": "batch_cancelled", "EXPIRED": "batch_expired", "FAILED": "batch_failed",
        "ABORTED": "batch_aborted"}
    assert End.CANCELLED.unrun_message() == "the batch was cancelled before this request started"
    assert End.EXPIRED.unrun_message(waiting=True) == ("the batch's completion window ended while this request "
                                                       "waited for its engine, which was not answering")
