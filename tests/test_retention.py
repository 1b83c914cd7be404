"""Retention for operators: `--retention-days` prunes ended batches with their files and bytes, bookkeeping rows
go whatever it is, `orl admin prune [--dry-run]` does the same on demand; and the sweeper's lease lets one pass
run at a time (worker/sweeper.py, store/retention.py)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from openrelay.store.db import Database
from openrelay.store.retention import Retention
from tests.conftest import BACKEND
from tests.support.batches import chat, create, error_of, get, jsonl, upload
from tests.support.polling import wait_for
from tests.support.seaweed import S3Bucket, s3_bucket, seaweed  # noqa: F401  (session fixtures)
from tests.support.server import Server, create_pg_database, drop_pg_database
from tests.support.store_rows import local_blobs, rows_where, s3_blobs, table_rows
from tests.support.test_engine import EngineControl as Engine

SWEEP_OFTEN = {"OPENRELAY_SWEEP_SECONDS": "0.2"}
# Every kind of row a batch leaves: an inline input, a rejected record, an output and an error line.
RECORDS = [chat("ok"), chat("refused", text="#status=400"), {"custom_id": "bad"}]


def _back_to_baseline(server: Server, baseline: dict[str, int]) -> None:
    """Wait for every table's rows to come back to ``baseline``; on a timeout, say which tables did not."""
    try:
        wait_for(lambda: table_rows(server.database_url) == baseline, "every row back to the baseline")
    except AssertionError as exc:
        now = table_rows(server.database_url)
        off = {name: (baseline.get(name), rows) for name, rows in now.items() if baseline.get(name) != rows}
        raise AssertionError(f"{exc}; (baseline, now) of the tables that differ: {off}") from None


def _baseline(server: Server) -> dict[str, int]:
    """The store's rows once the sweeper made its lease row: what pruning comes back to."""
    wait_for(lambda: table_rows(server.database_url)["sweeps"], "the first sweeper pass")
    return table_rows(server.database_url)


def _pruned(server: Server, batches: list[dict[str, Any]]) -> None:
    """Wait until each batch (as its create answered) is gone, and its files with it (its input in the same pass,
    a transaction later). With a retention of 0 days a batch goes as soon as it ends, before a poll may see it
    ended."""
    for batch in batches:
        wait_for(lambda b=batch: server.http("GET", f"/batches/{b['id']}").status_code == 404, "the batch to go")
        for file_id in (batch["input_file_id"], f"file-{batch['id']}-output", f"file-{batch['id']}-error"):
            wait_for(lambda f=file_id: server.http("GET", f"/files/{f}").status_code == 404, f"{file_id} to go")
            error_of(server.http("GET", f"/files/{file_id}"), 404, "not_found", param="file_id")


def _run_batches(server: Server, count: int = 2) -> list[dict[str, Any]]:
    ended = [server.wait(create(server, RECORDS)["id"]) for _ in range(count)]
    assert all(b["status"] == "completed" and b["error_file_id"] and b["output_file_id"] for b in ended)
    return ended


def test_retention_prunes_ended_batches_rows_files_and_bytes_and_spares_running_ones(
        make_server: Callable[..., Server], engine: Engine) -> None:
    server = make_server(args=("--retention-days", "0"), env={**SWEEP_OFTEN, "OPENRELAY_IDEMPOTENCY_SECONDS": "1"})
    baseline = _baseline(server)
    running = create(server, [chat("held", text="#hold=kept")])
    engine.wait_held("kept")
    answer = server.http("POST", "/batches", headers={"Idempotency-Key": "k1"},
                         json={"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": RECORDS})
    assert table_rows(server.database_url)["idempotency_keys"] == 1
    _pruned(server, [answer.json(), create(server, RECORDS), create(server, RECORDS)])
    asked = [r["body"]["messages"][0]["content"] for r in engine.requests()]
    assert asked.count("hi") == asked.count("#status=400") == 3  # they ran before they went
    # The running batch and its input are kept: the retention counts from a batch's end.
    assert get(server, running["id"])["status"] == "in_progress"
    assert server.http("GET", f"/files/{running['input_file_id']}").status_code == 200
    engine.release("kept")
    _pruned(server, [running])
    _back_to_baseline(server, baseline)
    wait_for(lambda: local_blobs(server.data_dir / "blobs") == {}, "every blob deleted")


def test_orl_worker_takes_retention_days_and_sweeps(make_server: Callable[..., Server],
                                                    start_worker: Callable[..., Any]) -> None:
    server = make_server(args=("--no-worker",))  # the API sweeps nothing: only workers do
    worker = start_worker(server, args=("--retention-days", "0"), env=SWEEP_OFTEN)
    baseline = _baseline(server)
    _pruned(server, [create(server, RECORDS)])
    _back_to_baseline(server, baseline)
    wait_for(lambda: local_blobs(server.data_dir / "blobs") == {}, "every blob deleted")
    wait_for(lambda: "sweeper: removed" in worker.log(), "the worker to say what its sweeper removed")


def test_bookkeeping_rows_are_pruned_whatever_the_retention(make_server: Callable[..., Server]) -> None:
    server = make_server(env={**SWEEP_OFTEN, "OPENRELAY_BOOKKEEPING_DAYS": "0",
                              "OPENRELAY_WEBHOOK_LOG_KEEP_SECONDS": "1"})  # the delivery log's own age
    _baseline(server)
    batch = _run_batches(server, 1)[0]
    wait_for(lambda: not rows_where(server.database_url, "batch_chunks", batch_id=batch["id"]), "chunk rows to go")
    wait_for(lambda: not rows_where(server.database_url, "webhook_events", batch_id=batch["id"]), "the event to go")
    row = rows_where(server.database_url, "batches", id=batch["id"])[0]
    assert row["throughput_window"] is None
    # The batch and its files are kept: no retention was asked for.
    assert get(server, batch["id"])["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert server.http("GET", f"/files/{batch['output_file_id']}/content").status_code == 200


def _prune(server: Server, *args: str) -> dict[str, Any]:
    done = server.admin("--data-dir", str(server.data_dir), "prune", *args)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def test_admin_prune_says_what_it_would_remove_then_removes_it(make_server: Callable[..., Server]) -> None:
    server = make_server()  # no retention: the sweeper keeps every batch
    baseline = _baseline(server)
    batch = _run_batches(server, 1)[0]
    unused = upload(server, jsonl(chat("never used")))
    before, blobs = table_rows(server.database_url), local_blobs(server.data_dir / "blobs")
    assert len(blobs) == 5  # the inline input, the upload, the rejections, the output and the error file

    dry = _prune(server, "--dry-run", "--retention-days", "0")
    assert dry["dry_run"] is True and dry["retention_days"] == 0
    assert (dry["would_remove"]["batches"], dry["would_remove"]["files"]) == (1, 5)
    assert dry["would_remove"]["file_bytes"] == sum(blobs.values())
    assert table_rows(server.database_url) == before and local_blobs(server.data_dir / "blobs") == blobs

    kept = _prune(server)  # retention unset (OPENRELAY_RETENTION_DAYS too): batches are kept forever
    assert kept["retention_days"] is None and "batches" not in kept["removed"]
    assert get(server, batch["id"])["id"] == batch["id"]

    done = _prune(server, "--retention-days", "0")
    assert (done["removed"]["batches"], done["removed"]["files"]) == (1, 5)
    assert done["removed"]["file_bytes"] == sum(blobs.values())
    assert done["removed"]["blobs"] == 6  # the five files and the batch's folder
    assert local_blobs(server.data_dir / "blobs") == {}
    assert table_rows(server.database_url) == baseline
    # The server's poll cache may answer from before the prune (another process) for OPENRELAY_POLL_CACHE_SECONDS.
    wait_for(lambda: server.http("GET", f"/batches/{batch['id']}").status_code == 404, "the pruned batch to go")
    error_of(server.http("GET", f"/batches/{batch['id']}"), 404, "not_found", param="batch_id")
    error_of(server.http("GET", f"/files/{unused}"), 404, "not_found", param="file_id")


@pytest.mark.slow
def test_expiry_and_retention_delete_the_bytes_from_s3(make_server: Callable[..., Server],
                                                       s3_bucket: S3Bucket) -> None:  # noqa: F811
    prefix = "retention-" + secrets.token_hex(4)
    server = make_server(args=("--blob-url", s3_bucket.url(prefix), "--retention-days", "0",
                               "--min-expiry-seconds", "1"), env={**s3_bucket.server.env(), **SWEEP_OFTEN})
    baseline = _baseline(server)
    store = s3_bucket.server.store(s3_bucket.name)
    _pruned(server, [create(server, RECORDS), create(server, RECORDS)])
    client = server.client()
    short = client.files.create(file=("s.jsonl", jsonl(chat("a"))), purpose="batch",
                                expires_after={"anchor": "created_at", "seconds": 1})
    wait_for(lambda: server.http("GET", f"/files/{short.id}").status_code == 404, "the upload to expire")
    wait_for(lambda: s3_blobs(store, prefix + "/") == {}, "every object under the prefix to go")
    _back_to_baseline(server, baseline)


@pytest.fixture
def store_url(tmp_path: Path) -> Any:
    if BACKEND == "postgres":
        url = create_pg_database()
        yield url
        drop_pg_database(url)
    else:
        yield f"sqlite:///{tmp_path / 'sweeps.db'}"


def test_one_sweeper_pass_at_a_time_across_the_fleet(store_url: str) -> None:
    db = Database(store_url)
    db.migrate()
    try:
        first, second = Retention(db), Retention(db)
        assert first.take_pass("worker-a", 300) is True
        assert second.take_pass("worker-b", 300) is False  # a pass runs: none beside it
        first.end_pass("worker-a", next_in=3600)
        assert second.take_pass("worker-b", 300) is False  # none due before the next pass's time
        first.end_pass("worker-a", next_in=0)  # ended by its owner only: nothing changes
        assert second.take_pass("worker-b", 300) is False
        with db.write() as conn:  # the next pass is due now (as after a pass that stopped at its bound)
            conn.exec_driver_sql("UPDATE sweeps SET next_pass_at = 0")
        assert second.take_pass("worker-b", -1) is True  # taken with a lease already lapsed: as if b died
        assert first.take_pass("worker-a", 300) is True  # a lapsed lease is taken over
        assert second.take_pass("worker-b", 300) is False
    finally:
        db.dispose()
