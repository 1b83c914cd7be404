"""Durable progress of running batches: chunks of settled records, and the finalizing of a batch.

A chunk's result lines are written to blobs first; the chunk row, the batch's counters and usage, and the key's
spend and hard-budget reservation (store/budgets.py) are then committed in one transaction, fenced by the worker's
lease. So a record is counted and billed exactly when its line became durable, and a worker that lost its lease
cannot add anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import StoreError
from ..ids import now
from ..types import BatchStatus
from .budgets import release, settle
from .db import Database
from .ended_counts import count_ended
from .files import insert_file
from .schema import batch_chunks, batches
from .throughput import add_flush
from .webhook_outbox import enqueue_batch_event

__all__ = ["Results", "Chunk", "LeaseLost", "ResultFile"]


class LeaseLost(StoreError):
    code = "lease_lost"


@dataclass(frozen=True, kw_only=True)
class Chunk:
    seq: int
    out_key: str | None
    err_key: str | None
    lines: list[int]
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    cost_nano_usd: int
    out_bytes: int | None = None  # the blobs' sizes, for reads of a running batch's result files
    err_bytes: int | None = None
    cached_tokens: int = 0  # of input_tokens
    reasoning_tokens: int = 0  # of output_tokens


@dataclass(frozen=True, kw_only=True)
class ResultFile:
    file_id: str
    blob_key: str
    size: int
    filename: str


class Results:
    def __init__(self, db: Database) -> None:
        self.db = db

    def chunks(self, batch_id: str) -> list[Chunk]:
        with self.db.read() as conn:
            rows = conn.execute(sa.select(batch_chunks).where(batch_chunks.c.batch_id == batch_id)
                                .order_by(batch_chunks.c.seq)).all()
        return [Chunk(seq=r.seq, out_key=r.out_key, err_key=r.err_key, lines=orjson.loads(r.lines),
                      completed=r.completed, failed=r.failed, input_tokens=r.input_tokens,
                      output_tokens=r.output_tokens, cost_nano_usd=r.cost_nano_usd, cached_tokens=r.cached_tokens,
                      reasoning_tokens=r.reasoning_tokens) for r in rows]

    def chunk_times(self, batch_id: str) -> list[tuple[int, int, int]]:
        """(created_at, records, tokens) of each durable chunk of a batch, oldest first: its throughput."""
        c = batch_chunks.c
        with self.db.read() as conn:
            rows = conn.execute(sa.select(c.created_at, c.completed + c.failed, c.input_tokens + c.output_tokens)
                                .where(c.batch_id == batch_id).order_by(c.seq)).all()
        return [(int(r[0]), int(r[1]), int(r[2])) for r in rows]

    def commit_chunk(self, batch_id: str, worker_id: str, key_id: str, chunk: Chunk) -> None:
        """Idempotent per (batch, seq): a retry of a chunk whose commit did land (the answer was lost) adds
        nothing again. A chunk of that seq from another run (its blob keys differ: ``blobs.keys.chunk_key``)
        means this run's lease was lost, whoever holds it now: ``LeaseLost``."""
        with self.db.write() as conn:
            landed = conn.execute(sa.select(batch_chunks.c.out_key, batch_chunks.c.err_key).where(
                batch_chunks.c.batch_id == batch_id, batch_chunks.c.seq == chunk.seq)).first()
            if landed is not None:
                if tuple(landed) == (chunk.out_key, chunk.err_key):
                    return
                raise LeaseLost(f"batch {batch_id}: chunk {chunk.seq} was written by another run")
            row = conn.execute(sa.select(batches.c.throughput_window, batches.c.reserved_nano_usd)
                               .where(batches.c.id == batch_id)).first()
            window, reserved = (None, 0) if row is None else row  # no row: the fenced update below says LeaseLost
            done = conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.lease_owner == worker_id,
            ).values(
                throughput_window=add_flush(window, time.time(), chunk.completed + chunk.failed,
                                            chunk.input_tokens + chunk.output_tokens),
                completed=batches.c.completed + chunk.completed,
                failed=batches.c.failed + chunk.failed,
                input_tokens=batches.c.input_tokens + chunk.input_tokens,
                cached_tokens=batches.c.cached_tokens + chunk.cached_tokens,
                output_tokens=batches.c.output_tokens + chunk.output_tokens,
                reasoning_tokens=batches.c.reasoning_tokens + chunk.reasoning_tokens,
                cost_nano_usd=batches.c.cost_nano_usd + chunk.cost_nano_usd,
            ))
            if done.rowcount == 0:
                raise LeaseLost(f"worker {worker_id} no longer holds batch {batch_id}")
            conn.execute(batch_chunks.insert().values(
                batch_id=batch_id, seq=chunk.seq, out_key=chunk.out_key, err_key=chunk.err_key,
                lines=orjson.dumps(chunk.lines).decode(), completed=chunk.completed, failed=chunk.failed,
                input_tokens=chunk.input_tokens, output_tokens=chunk.output_tokens,
                cost_nano_usd=chunk.cost_nano_usd, created_at=now(), out_bytes=chunk.out_bytes,
                err_bytes=chunk.err_bytes, cached_tokens=chunk.cached_tokens, reasoning_tokens=chunk.reasoning_tokens,
            ))
            settle(conn, batch_id=batch_id, key_id=key_id, reserved=reserved, cost_nano_usd=chunk.cost_nano_usd)

    def finalize(self, batch_id: str, worker_id: str, *, status: BatchStatus, output: ResultFile | None,
                 error: ResultFile | None, org_id: str, unrun: int | None,
                 errors: list[dict] | None = None) -> None:
        """Write the result files' rows and move the batch to its terminal status, releasing the lease.

        ``unrun`` records never ran (cancelled, expired or failed batch): they count as failed here, in the
        same transaction, so a finalizing retried after a crash cannot count them twice. None: every record without
        a line (a batch ended without its files).
        """
        stamp = now()
        with self.db.write() as conn:
            current, key_id, reserved, expires_after = conn.execute(
                sa.select(batches.c.status, batches.c.key_id, batches.c.reserved_nano_usd,
                          batches.c.output_expires_seconds)
                .where(batches.c.id == batch_id)).one()
            if status is BatchStatus.COMPLETED and current == BatchStatus.CANCELLING.value:
                # Cancelled while finalizing: every record ran, but the user asked to cancel; say so.
                status = BatchStatus.CANCELLED
            self._finalize(conn, batch_id, worker_id, status=status, output=output, error=error, org_id=org_id,
                           unrun=unrun, errors=errors, stamp=stamp, expires_after=expires_after)
            release(conn, batch_id=batch_id, key_id=key_id, reserved=reserved)  # after the lease's fence

    def _finalize(self, conn: Connection, batch_id: str, worker_id: str, *, status: BatchStatus,
                  output: ResultFile | None, error: ResultFile | None, org_id: str, unrun: int | None,
                  errors: list[dict] | None, stamp: int, expires_after: int | None = None) -> None:
        failed = batches.c.total - batches.c.completed if unrun is None else batches.c.failed + unrun
        values: dict = {"status": status.value, "lease_owner": None, "lease_expires_at": None,
                        f"{status.value}_at": stamp, "failed": failed, "retry_at": None}
        if status is not BatchStatus.FAILED:
            values["finalizing_at"] = sa.func.coalesce(batches.c.finalizing_at, stamp)
        if errors is not None:
            values["errors"] = orjson.dumps(errors).decode()
        for result, column in ((output, "output_file_id"), (error, "error_file_id")):
            if result is None:
                continue
            insert_file(conn, file_id=result.file_id, org_id=org_id, purpose="batch_output",
                        filename=result.filename, size=result.size, blob_key=result.blob_key,
                        expires_after=expires_after, created_at=stamp)
            values[column] = result.file_id
        done = conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.lease_owner == worker_id)
                            .values(**values))
        if done.rowcount == 0:
            raise LeaseLost(f"worker {worker_id} no longer holds batch {batch_id}")
        count_ended(conn, [batch_id], sign=1)  # the summary's counters, with the status (store/ended_counts.py)
        # The webhook event of this status, in the same transaction: both commit or neither (store/webhook_outbox.py).
        enqueue_batch_event(conn, clock=self.db.clock(conn), org_id=org_id, batch_id=batch_id, status=status,
                            stamp=stamp, errors=errors)
