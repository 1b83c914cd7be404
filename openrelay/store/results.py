"""Durable progress of running batches: chunks of settled records (their lines in blobs first, then the chunk row,
counters, usage and the key's spend in one transaction fenced by the lease: docs/design.md), and a batch's end."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ..clock import now, seconds
from ..errors import StoreError
from ..lifecycle import ENDS, TransitionRefused, final_status
from ..types import Batch, BatchStatus
from .budgets import release, settle
from .db import Database
from .ended_counts import count_ended
from .files import insert_file
from .leases import end_run
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
            rows = conn.execute(_CHUNKS, {"batch_id": batch_id}).all()
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

    def commit_chunk(self, batch_id: str, worker_id: str, key_id: str, chunk: Chunk, *,
                     run_ends: bool = False) -> Batch | None:
        """Idempotent per (batch, seq): a retry of a chunk whose commit did land (the answer was lost) adds
        nothing again. A chunk of that seq from another run (its blob keys differ: ``blobs.keys.chunk_key``)
        means this run's lease was lost, whoever holds it now: ``LeaseLost``.

        ``run_ends``: the last chunk of a run that ended as it should. Its transaction also ends the run
        (``BatchLeases.end_run``) and returns the batch as that leaves it: a small batch's end costs one
        transaction less."""
        with self.db.write() as conn:
            landed = conn.execute(_LANDED, {"batch_id": batch_id, "seq": chunk.seq}).first()
            if landed is not None:
                if tuple(landed) == (chunk.out_key, chunk.err_key):
                    return end_run(conn, batch_id, worker_id, may_complete=True) if run_ends else None
                raise LeaseLost(f"batch {batch_id}: chunk {chunk.seq} was written by another run")
            row = conn.execute(_WINDOW_AND_RESERVED, {"batch_id": batch_id}).first()
            window, reserved = (None, 0) if row is None else row  # no row: the fenced update below says LeaseLost
            done = conn.execute(_ADD_CHUNK, {
                "batch_id": batch_id, "owner": worker_id,
                "window": add_flush(window, seconds(), chunk.completed + chunk.failed,
                                    chunk.input_tokens + chunk.output_tokens),
                "d_completed": chunk.completed, "d_failed": chunk.failed, "d_input": chunk.input_tokens,
                "d_cached": chunk.cached_tokens, "d_output": chunk.output_tokens,
                "d_reasoning": chunk.reasoning_tokens, "d_cost": chunk.cost_nano_usd})
            if done.rowcount == 0:
                raise LeaseLost(f"worker {worker_id} no longer holds batch {batch_id}")
            conn.execute(batch_chunks.insert(), {
                "batch_id": batch_id, "seq": chunk.seq, "out_key": chunk.out_key, "err_key": chunk.err_key,
                "lines": orjson.dumps(chunk.lines).decode(), "completed": chunk.completed, "failed": chunk.failed,
                "input_tokens": chunk.input_tokens, "output_tokens": chunk.output_tokens,
                "cost_nano_usd": chunk.cost_nano_usd, "created_at": now(), "out_bytes": chunk.out_bytes,
                "err_bytes": chunk.err_bytes, "cached_tokens": chunk.cached_tokens,
                "reasoning_tokens": chunk.reasoning_tokens})
            settle(conn, batch_id=batch_id, key_id=key_id, reserved=reserved, cost_nano_usd=chunk.cost_nano_usd)
            return end_run(conn, batch_id, worker_id, may_complete=True) if run_ends else None

    def finalize(self, batch_id: str, worker_id: str, *, status: BatchStatus, output: ResultFile | None,
                 error: ResultFile | None, org_id: str, unrun: int | None,
                 errors: list[dict] | None = None) -> None:
        """Write the result files' rows and move the batch to its terminal status (``lifecycle.final_status`` of
        ``status``), releasing the lease; fenced by the lease (``LeaseLost``) and by the statuses the end may start
        from (``lifecycle.ENDS``: ``TransitionRefused``). The row is locked first, so a cancel waits for this end.

        ``unrun`` records never ran (cancelled, expired or failed batch): they count as failed here, in the
        same transaction, so a finalizing retried after a crash cannot count them twice. None: every record without
        a line (a batch ended without its files).
        """
        stamp = now()
        params: dict[str, Any] = {"batch_id": batch_id, "owner": worker_id, "stamp": stamp, "unrun": unrun or 0}
        if errors is not None:
            params["errors_json"] = orjson.dumps(errors).decode()
        with self.db.write() as conn:
            current, owner, key_id, reserved, expires_after = conn.execute(_ENDING, {"batch_id": batch_id}).one()
            status = final_status(status, unrun=unrun, current=BatchStatus(current))
            for result, column in ((output, "output_id"), (error, "error_id")):
                if result is not None:
                    insert_file(conn, file_id=result.file_id, org_id=org_id, purpose="batch_output",
                                filename=result.filename, size=result.size, blob_key=result.blob_key,
                                expires_after=expires_after, created_at=stamp)
                    params[column] = result.file_id
            done = conn.execute(_end_statement(status, every_unlined=unrun is None, errors=errors is not None,
                                               output=output is not None, error=error is not None), params)
            if done.rowcount == 0 and owner != worker_id:
                raise LeaseLost(f"worker {worker_id} no longer holds batch {batch_id}")
            if done.rowcount == 0:
                raise TransitionRefused(f"batch {batch_id}: {current} cannot end {status.value}")
            count_ended(conn, [batch_id], sign=1)  # the summary's counters, with the status (store/ended_counts.py)
            # Its webhook event, in the same transaction: both commit or neither (store/webhook_outbox.py).
            enqueue_batch_event(conn, clock=self.db.clock(conn), org_id=org_id, batch_id=batch_id, status=status,
                                stamp=stamp, errors=errors)
            release(conn, batch_id=batch_id, key_id=key_id, reserved=reserved)  # after the lease's fence


# The statements of a chunk's commit and a batch's end, built once (they run for every batch, however small).
_c = batches.c
_k = batch_chunks.c
_CHUNKS = sa.select(batch_chunks).where(_k.batch_id == sa.bindparam("batch_id")).order_by(_k.seq)
_LANDED = sa.select(_k.out_key, _k.err_key).where(_k.batch_id == sa.bindparam("batch_id"),
                                                  _k.seq == sa.bindparam("seq"))
_WINDOW_AND_RESERVED = sa.select(_c.throughput_window, _c.reserved_nano_usd).where(_c.id == sa.bindparam("batch_id"))
_ADD_CHUNK = batches.update().where(_c.id == sa.bindparam("batch_id"), _c.lease_owner == sa.bindparam("owner")).values(
    throughput_window=sa.bindparam("window"),
    completed=_c.completed + sa.bindparam("d_completed"), failed=_c.failed + sa.bindparam("d_failed"),
    input_tokens=_c.input_tokens + sa.bindparam("d_input"), cached_tokens=_c.cached_tokens + sa.bindparam("d_cached"),
    output_tokens=_c.output_tokens + sa.bindparam("d_output"),
    reasoning_tokens=_c.reasoning_tokens + sa.bindparam("d_reasoning"),
    cost_nano_usd=_c.cost_nano_usd + sa.bindparam("d_cost"))
_ENDING = sa.select(_c.status, _c.lease_owner, _c.key_id, _c.reserved_nano_usd, _c.output_expires_seconds).where(
    _c.id == sa.bindparam("batch_id")).with_for_update()


@functools.cache
def _end_statement(status: BatchStatus, *, every_unlined: bool, errors: bool, output: bool,
                   error: bool) -> sa.Update:
    """The terminal update of ``Results.finalize``, fenced by the lease (``owner``) and guarded by the statuses
    the end starts from: ``every_unlined`` counts every record without a line as failed, else the ``unrun`` ones
    are added to the failed."""
    stamp: sa.BindParameter[int] = sa.bindparam("stamp")
    values: dict[str, Any] = {
        "status": status.value, "lease_owner": None, "lease_expires_at": None, f"{status.value}_at": stamp,
        "failed": _c.total - _c.completed if every_unlined else _c.failed + sa.bindparam("unrun"), "retry_at": None,
        "unrun": _c.total - _c.completed - _c.failed if every_unlined else sa.bindparam("unrun")}
    if status is not BatchStatus.FAILED:
        values["finalizing_at"] = sa.func.coalesce(_c.finalizing_at, stamp)
    if errors:
        values["errors"] = sa.bindparam("errors_json")
    if output:
        values["output_file_id"] = sa.bindparam("output_id")
    if error:
        values["error_file_id"] = sa.bindparam("error_id")
    return batches.update().where(_c.id == sa.bindparam("batch_id"), _c.lease_owner == sa.bindparam("owner"),
                                  _c.status.in_(ENDS[status].source_values)).values(**values)
