"""A small batch's start and end on a real store (SQLite in a temp dir, or a fresh PostgreSQL database): the claim
queues the batches validated since the last one itself, says whether it took one from the queue, and the commit of a
run's last chunk also ends the run (docs/design.md, "A small batch's start and end")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openrelay.clock import now, now_ns
from openrelay.ids import new_batch_id
from openrelay.store.accounts import Accounts
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.leases import BatchLeases
from openrelay.store.results import Chunk, LeaseLost, Results
from openrelay.types import Batch, BatchStatus
from tests.conftest import BACKEND  # noqa: F401 - picks its store by OPENRELAY_TEST_DB (tests/conftest.py)
from tests.support.store_rows import fresh_database


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        yield database


def _validated_batch(db: Database, total: int = 1, status: BatchStatus = BatchStatus.VALIDATING) -> Batch:
    """A batch as a create leaves it: validated, not yet in its model's queue."""
    accounts = Accounts(db)
    org = accounts.create_org(f"org-{now_ns()}")
    key, _secret = accounts.create_key(org.id)
    created = now()
    batch = Batch(id=new_batch_id(), org_id=org.id, key_id=key.id, endpoint="/v1/chat/completions",
                  input_file_id="file-x", input_blob_key="files/x", completion_window="24h", priority="standard",
                  status=status, model="m", created_at=created, expires_at=created + 86_400, total=total)
    Batches(db).create(batch, now_ns(), [])
    return batch


def _chunk(seq: int, lines: list[int]) -> Chunk:
    return Chunk(seq=seq, out_key=f"batches/b/chunks/{seq:06d}.run.out.jsonl", err_key=None, lines=lines,
                 completed=len(lines), failed=0, input_tokens=len(lines), output_tokens=len(lines), cost_nano_usd=0)


def test_a_claim_queues_the_validated_batches_itself_and_says_it_took_one_from_the_queue(db: Database) -> None:
    batch = _validated_batch(db)
    claimed = BatchLeases(db).claim("w1", {"m": 2}, 60.0)  # a claim queues the validated batch itself
    assert claimed is not None and claimed.id == batch.id
    assert claimed.status is BatchStatus.IN_PROGRESS and claimed.from_queue and claimed.lease_owner == "w1"
    assert BatchLeases(db).claim("w1", {"m": 2}, 60.0, frozenset({batch.id})) is None


def test_a_batch_to_end_is_not_from_the_queue(db: Database) -> None:
    batch = _validated_batch(db, status=BatchStatus.CANCELLING)
    claimed = BatchLeases(db).claim("w1", {"m": 2}, 60.0)
    assert claimed is not None and claimed.id == batch.id and not claimed.from_queue


def test_the_last_chunks_commit_ends_the_run_once_every_record_has_its_line(db: Database) -> None:
    batch = _validated_batch(db, total=3)
    results = Results(db)
    assert BatchLeases(db).claim("w1", {"m": 2}, 60.0) is not None
    assert results.commit_chunk(batch.id, "w1", batch.key_id, _chunk(1, [1])) is None  # not the last: no end
    short = results.commit_chunk(batch.id, "w1", batch.key_id, _chunk(2, [2]), run_ends=True)
    assert short is not None and short.status is BatchStatus.IN_PROGRESS  # a record has no line: not finalizing
    ended = results.commit_chunk(batch.id, "w1", batch.key_id, _chunk(3, [3]), run_ends=True)
    assert ended is not None and ended.status is BatchStatus.FINALIZING and ended.completed == 3
    assert ended.finalizing_at is not None and ended.lease_owner == "w1"
    again = results.commit_chunk(batch.id, "w1", batch.key_id, _chunk(3, [3]), run_ends=True)  # a retried commit
    assert again is not None and again.status is BatchStatus.FINALIZING and again.completed == 3
    with pytest.raises(LeaseLost):
        results.commit_chunk(batch.id, "w2", batch.key_id, _chunk(4, [3]), run_ends=True)


def test_a_cancelled_batch_is_not_moved_to_finalizing_by_its_last_chunk(db: Database) -> None:
    batch = _validated_batch(db)
    assert BatchLeases(db).claim("w1", {"m": 2}, 60.0) is not None
    Batches(db).request_cancel(batch.org_id, batch.id)
    ended = Results(db).commit_chunk(batch.id, "w1", batch.key_id, _chunk(1, [1]), run_ends=True)
    assert ended is not None and ended.status is BatchStatus.CANCELLING and ended.completed == 1
