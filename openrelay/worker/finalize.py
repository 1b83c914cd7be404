"""Settling a batch: compose its result files from the durable chunks and give it its terminal status.

Safe to run again after a crash at any point: every blob it writes is rewritten whole, and the status, file
rows and counts change in one transaction at the very end.
"""

from __future__ import annotations

from ..ids import error_file_id, output_file_id
from ..runtime import Runtime
from ..store.results import ResultFile
from ..types import Batch, BatchStatus
from .inputs import chunk_key, error_key, output_key, pending_records, read_rejections, tail_key
from .lines import rejection_line, unrun_line

__all__ = ["settle_batch"]

_UNRUN_CODE = {
    BatchStatus.CANCELLED: "batch_cancelled",
    BatchStatus.EXPIRED: "batch_expired",
    BatchStatus.FAILED: "batch_failed",
}


def settle_batch(rt: Runtime, worker_id: str, batch: Batch, status: BatchStatus,
                 errors: list[dict] | None = None) -> None:
    chunks = rt.results.chunks(batch.id)
    rejections = read_rejections(rt.blobs, batch)
    settled = {line for chunk in chunks for line in chunk.lines}
    skip = settled | {r.line for r in rejections}
    unrun = 0
    with rt.blobs.writer(tail_key(batch.id)) as tail:
        for rejection in rejections:
            tail.write(rejection_line(rejection))
        if status is not BatchStatus.COMPLETED:
            code = _UNRUN_CODE[status]
            for _line, record in pending_records(rt.blobs, batch, skip, rt.settings.max_line_bytes):
                tail.write(unrun_line(record["custom_id"], code))
                unrun += 1
    output = error = None
    if any(c.completed for c in chunks):
        size = rt.blobs.compose(output_key(batch.id), [c.out_key for c in chunks if c.out_key])
        output = ResultFile(file_id=output_file_id(batch.id), blob_key=output_key(batch.id), size=size,
                            filename=f"{batch.id}_output.jsonl")
    if rejections or unrun or any(c.failed for c in chunks):
        sources = [c.err_key for c in chunks if c.err_key] + [tail_key(batch.id)]
        size = rt.blobs.compose(error_key(batch.id), sources)
        error = ResultFile(file_id=error_file_id(batch.id), blob_key=error_key(batch.id), size=size,
                           filename=f"{batch.id}_error.jsonl")
    rt.results.settle(batch.id, worker_id, status=status, output=output, error=error, org_id=batch.org_id,
                      unrun=unrun, errors=errors)
    for chunk in chunks:
        for kind in ("out", "err"):
            rt.blobs.delete(chunk_key(batch.id, chunk.seq, kind))
    rt.blobs.delete(tail_key(batch.id))
    for file_key in rt.files.orphaned_batch_blobs(batch):
        rt.blobs.delete(file_key)
