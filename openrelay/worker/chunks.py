"""Making a running batch's finished records durable: one writer per run, the only one that writes its chunks
(blobs first, then one transaction fenced by the lease: ``Results.commit_chunk``). A failed write keeps its chunk
and is retried, idempotent per seq; lanes wait while ``2 x flush_records`` are waiting (docs/guarantees.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backoff import Backoff
from ..blobs.keys import chunk_key
from ..metrics import RECORDS
from ..runtime import Runtime
from ..store.results import Chunk, LeaseLost
from ..types import Batch
from .usage import RecordUsage

__all__ = ["ChunkWriter"]

log = logging.getLogger("openrelay.worker")


@dataclass
class _Pending:
    lines: list[int] = field(default_factory=list)
    out: list[bytes] = field(default_factory=list)
    err: list[bytes] = field(default_factory=list)
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost: int = 0


class ChunkWriter:
    def __init__(self, rt: Runtime, batch: Batch, worker_id: str, *, last_seq: int, model: str) -> None:
        self.rt = rt
        self.batch = batch
        self.worker_id = worker_id
        self.model = model
        self.settings = rt.settings
        self._seq = last_seq
        self._run = secrets.token_hex(4)  # in this run's chunk keys: no other run writes the same blob
        self._pending = _Pending()
        self._unwritten: tuple[int, _Pending] | None = None  # a chunk whose write failed, written again as is
        self.committed: list[Chunk] = []  # the chunks this run made durable, in order
        self.ended: Batch | None = None  # the batch as the last chunk's commit ended the run (``close``)
        self._ends_run = False
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        # The first retry of a failed write waits two flush intervals, the next four, up to the store's cap.
        self._write_retries = Backoff(base=2 * self.settings.worker.flush_seconds,
                                      cap=self.settings.worker.store_retry_max_seconds)

    # -- the lanes' side ---------------------------------------------------------------------------------------

    def add_output(self, line: int, data: bytes, *, usage: RecordUsage, cost: int) -> None:
        pending = self._pending
        pending.out.append(data)
        pending.input_tokens += usage.input_tokens
        pending.cached_tokens += usage.cached_tokens
        pending.output_tokens += usage.output_tokens
        pending.reasoning_tokens += usage.reasoning_tokens
        pending.cost += cost
        self._added(line)

    def add_error(self, line: int, data: bytes) -> None:
        self._pending.err.append(data)
        self._added(line)

    def _added(self, line: int) -> None:
        self._pending.lines.append(line)
        if len(self._pending.lines) >= self.settings.worker.flush_records and self._unwritten is None:
            self._wake.set()  # not while a failed write backs off: the backlog waits for it
        if self.backlog >= 2 * self.settings.worker.flush_records:
            self._room.clear()

    @property
    def backlog(self) -> int:
        """Finished records not yet durable."""
        return len(self._pending.lines) + (len(self._unwritten[1].lines) if self._unwritten else 0)

    async def wait_for_room(self, timeout: float) -> bool:
        """Whether a lane may take another record; waits up to ``timeout`` while the backlog is full."""
        if not self._room.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout)
        return self._room.is_set()

    # -- the writer's side ---------------------------------------------------------------------------------

    def close(self, *, ends_run: bool = False) -> None:
        """No more records will come: ``run`` returns once everything is durable. ``ends_run``: the run ended
        as it should (no failure, no early abort), and the commit of a last chunk written after this also ends
        it (``Results.commit_chunk``); ``ended`` is then the batch as that commit left it."""
        self._closing = True
        self._ends_run = ends_run
        self._wake.set()

    async def run(self, lost: Callable[[], bool]) -> None:
        """Write chunks until closed and drained. Raises ``LeaseLost`` when the commit's fence says so, or when a
        write keeps failing and ``lost()`` says the lease may have lapsed meanwhile. Once it ends, lanes waiting
        for room go on at once (to find the run stopped) rather than at their next tick."""
        try:
            await self._write_until_drained(lost)
        finally:
            self._room.set()

    async def _write_until_drained(self, lost: Callable[[], bool]) -> None:
        delay = self.settings.worker.flush_seconds
        failures = 0
        while True:
            if failures or not self._closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            if await self._write_next():
                failures, delay = 0, self.settings.worker.flush_seconds
                if self._closing and not self.backlog:
                    return
                continue
            failures += 1
            if lost():
                raise LeaseLost(f"batch {self.batch.id}: results could not be written before the lease lapsed")
            delay = self._write_retries.delay(failures)

    async def _write_next(self) -> bool:
        """Write the unwritten chunk, else the pending records as a new one. False when the write failed."""
        if self._unwritten is None:
            if not self._pending.lines:
                return True
            self._seq += 1
            self._unwritten, self._pending = (self._seq, self._pending), _Pending()
        seq, pending = self._unwritten
        last = self._ends_run and not self._pending.lines  # closed, and no record comes after this chunk
        try:
            await asyncio.to_thread(self._write_chunk, seq, pending, last)
        except LeaseLost:
            raise
        except Exception as exc:  # the store or the blob store is away: keep the chunk, try again later
            log.warning("batch %s: writing results failed (%d records; %s: %s); retrying with backoff",
                        self.batch.id, len(pending.lines), exc.__class__.__name__, exc)
            return False
        self._unwritten = None
        if self.backlog < 2 * self.settings.worker.flush_records:
            self._room.set()
        return True

    def _write_chunk(self, seq: int, pending: _Pending, last: bool) -> None:
        keys: dict[str, str | None] = {"out": None, "err": None}
        sizes: dict[str, int | None] = {"out": None, "err": None}
        for lines, kind in ((pending.out, "out"), (pending.err, "err")):
            if lines:
                key = chunk_key(self.batch.id, seq, kind, self._run)
                data = b"".join(lines)
                with self.rt.blobs.writer(key) as handle:
                    handle.write(data)
                keys[kind], sizes[kind] = key, len(data)
        chunk = Chunk(seq=seq, out_key=keys["out"], err_key=keys["err"], lines=pending.lines,
                      completed=len(pending.out), failed=len(pending.err), input_tokens=pending.input_tokens,
                      cached_tokens=pending.cached_tokens, output_tokens=pending.output_tokens,
                      reasoning_tokens=pending.reasoning_tokens, cost_nano_usd=pending.cost, out_bytes=sizes["out"],
                      err_bytes=sizes["err"])
        try:
            ended = self.rt.results.commit_chunk(self.batch.id, self.worker_id, self.batch.key_id, chunk,
                                                 run_ends=last)
        except LeaseLost:  # another run holds the batch: these blobs are no chunk's; nothing reads them
            for key in filter(None, keys.values()):
                with contextlib.suppress(Exception):
                    self.rt.blobs.delete(key)
            raise
        self.committed.append(chunk)
        self.ended = ended
        RECORDS.labels(self.model, "completed").inc(chunk.completed)
        RECORDS.labels(self.model, "failed").inc(chunk.failed)
