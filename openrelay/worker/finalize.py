"""Finalizing a batch: compose its result files from the durable chunks and give it its terminal status. Safe to
run again after a crash at any point: every blob is rewritten whole, and the rows change in one transaction at the
end. ``end_failed_batch`` ends a batch whose runs kept failing, even when its files cannot be composed."""

from __future__ import annotations

import logging
from collections.abc import Callable

from .. import tracing
from ..blobs.keys import chunks_folder, dispatch_order_key, error_key, error_tail_key, output_key
from ..ids import error_file_id, output_file_id
from ..lifecycle import End, decide_end
from ..runtime import Runtime
from ..store.results import Chunk, LeaseLost, ResultFile
from ..types import Batch
from .inputs import Unreadable, pending_records, read_rejections
from .lines import rejection_line, unrun_line

__all__ = ["finalize_batch", "end_failed_batch"]

log = logging.getLogger("openrelay.worker")


def finalize_batch(rt: Runtime, worker_id: str, batch: Batch, end: End, errors: list[dict] | None = None, *,
                   chunks: list[Chunk] | None = None, ended: Callable[[], None] | None = None) -> None:
    """End the batch as ``end`` says (``lifecycle.decide_end``). ``chunks``: the batch's durable chunks, when the
    caller knows them (its run committed them under its lease); else they are read. ``ended`` is called once the
    terminal transaction commits, before the blobs it no longer needs go."""
    with tracing.span("batch finalize", {"openrelay.batch_id": batch.id, "openrelay.status": end.status.value}):
        _finalize(rt, worker_id, batch, end, errors, chunks=chunks, ended=ended)


def _finalize(rt: Runtime, worker_id: str, batch: Batch, end: End, errors: list[dict] | None, *,
              chunks: list[Chunk] | None, ended: Callable[[], None] | None) -> None:
    if chunks is None:
        chunks = rt.results.chunks(batch.id)
    rejections = read_rejections(rt.blobs, batch)
    settled = {line for chunk in chunks for line in chunk.lines}
    skip = settled | {r.line for r in rejections}
    unrun = 0
    tail = bool(rejections) or end is not End.COMPLETED  # a completed batch's tail holds its rejections
    if tail:
        with rt.blobs.writer(error_tail_key(batch.id)) as out:
            for rejection in rejections:
                out.write(rejection_line(rejection))
            if end is not End.COMPLETED:
                for _line, record in pending_records(rt.blobs, batch, skip, rt.settings.batches.max_line_bytes):
                    out.write(unrun_line(record.custom_id if isinstance(record, Unreadable) else record["custom_id"],
                                         end))
                    unrun += 1
    output = error = None
    if any(c.completed for c in chunks):
        size = rt.blobs.compose(output_key(batch.id), [c.out_key for c in chunks if c.out_key])
        output = ResultFile(file_id=output_file_id(batch.id), blob_key=output_key(batch.id), size=size,
                            filename=f"{batch.id}_output.jsonl")
    if rejections or unrun or any(c.failed for c in chunks):
        sources = [c.err_key for c in chunks if c.err_key] + ([error_tail_key(batch.id)] if tail else [])
        size = rt.blobs.compose(error_key(batch.id), sources)
        error = ResultFile(file_id=error_file_id(batch.id), blob_key=error_key(batch.id), size=size,
                           filename=f"{batch.id}_error.jsonl")
    # Only a run reads the dispatch order. Gone before the batch ends, so no poll sees an ended batch with it; a run
    # that resumes the batch after all (this finalizing loses its lease) sends the rest in input order.
    rt.blobs.delete(dispatch_order_key(batch.id))
    rt.results.finalize(batch.id, worker_id, status=end.status, output=output, error=error, org_id=batch.org_id,
                        unrun=unrun, errors=errors)  # an expiry that left none unrun completes (``final_status``)
    if ended is not None:
        ended()
    # Every chunk is in the result files now. The folder also holds any chunk a run wrote but never committed
    # (killed between its blobs and its commit, or refused for a lost lease): nothing names those, so they go too.
    rt.blobs.delete_folder(chunks_folder(batch.id))
    rt.blobs.delete(error_tail_key(batch.id))  # also one an earlier finalizing of the batch wrote, then crashed
    for file_key in rt.files.orphaned_batch_blobs(batch):
        rt.blobs.delete(file_key)


def end_failed_batch(rt: Runtime, worker_id: str, batch: Batch, why: str) -> None:
    """End a batch whose runs kept failing: ``failed`` with ``errors`` saying why, or the end the user or the window
    asked for (cancelled, expired). With its files if they can be composed, else without them, every record
    without a line counted as failed, so a broken input or blob cannot keep the batch alive."""
    end = decide_end(batch.status, past_window=batch.past_window(), runs_failed=True)
    assert end is not None
    errors = [{"code": "batch_run_failed", "message": why[:1000], "param": None, "line": None}]
    try:
        finalize_batch(rt, worker_id, batch, end, errors)
        return
    except LeaseLost:
        raise
    except Exception:
        log.exception("batch %s: its result files cannot be composed; ending it without them", batch.id)
    rt.results.finalize(batch.id, worker_id, status=end.status, output=None, error=None, org_id=batch.org_id,
                        unrun=None, errors=errors)
