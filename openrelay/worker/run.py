"""Running one claimed batch: keep ``concurrency`` requests in flight, make results durable in chunks.

A heartbeat renews the lease and watches for cancel; each lane checks the window before it takes a record.
Every ``flush_seconds`` the finished records are written as one chunk (blobs, then one fenced transaction); a
crash loses at most the records in flight or waiting for that flush, and those run again on resume. Nothing
else is held in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..catalog import ModelSpec
from ..engines.base import EngineReply, EngineUnavailable, error_body
from ..metrics import ENGINE_RETRIES, RECORDS, RUNNING_BATCHES
from ..runtime import Runtime
from ..store.results import Chunk, LeaseLost
from ..types import Batch, BatchStatus
from .finalize import settle_batch
from .gate import EngineGate
from .inputs import chunk_key, pending_records, read_rejections
from .lines import engine_error_line, error_line, output_line

__all__ = ["BatchRun"]

log = logging.getLogger("openrelay.worker")


@dataclass
class _Pending:
    lines: list[int] = field(default_factory=list)
    out: list[bytes] = field(default_factory=list)
    err: list[bytes] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost: int = 0


class _Stopped(Exception):
    """A record left unfinished because its batch stops: cancelled, out of its window, or its lease lost."""


class _RecordFailed(Exception):
    """A record that ends with an error line of its own code (its tool loop failed), not an engine's answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BatchRun:
    def __init__(self, rt: Runtime, worker_id: str, batch: Batch, spec: ModelSpec, gate: EngineGate) -> None:
        self.rt = rt
        self.worker_id = worker_id
        self.batch = batch
        self.spec = spec
        self.gate = gate
        self.price = spec.price(rt.catalog.factor(batch.priority))
        self.settings = rt.settings
        self._pending = _Pending()
        self._unwritten: tuple[int, _Pending] | None = None  # a chunk whose write failed, retried as is
        self._flush_lock = asyncio.Lock()
        self._seq = 0
        self._cancel = False
        self._lost = False
        self._stopped_early = False

    # -- the whole run ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        chunks = await asyncio.to_thread(self.rt.results.chunks, self.batch.id)
        rejections = await asyncio.to_thread(read_rejections, self.rt.blobs, self.batch)
        self._seq = max((c.seq for c in chunks), default=0)
        skip = {line for c in chunks for line in c.lines} | {r.line for r in rejections}
        heartbeat = asyncio.create_task(self._heartbeat())
        flusher = asyncio.create_task(self._flush_periodically())
        RUNNING_BATCHES.labels(self.spec.name).inc()
        try:
            await self._dispatch(skip)
            await self._flush()
        except* LeaseLost:
            self._lost = True
        finally:
            heartbeat.cancel()
            flusher.cancel()
            RUNNING_BATCHES.labels(self.spec.name).dec()
        if self._lost:
            log.warning("batch %s: lease lost; another worker resumes it", self.batch.id)
            return
        if self._cancel:
            status = BatchStatus.CANCELLED
        elif self._stopped_early:
            status = BatchStatus.EXPIRED  # the only other reason to stop early
        else:
            status = BatchStatus.COMPLETED
        if status is BatchStatus.COMPLETED:
            await asyncio.to_thread(self.rt.batches.mark_finalizing, self.batch.id, self.worker_id)
        await asyncio.to_thread(settle_batch, self.rt, self.worker_id, self.batch, status)

    @property
    def _stopping(self) -> bool:
        return self._cancel or self._lost

    async def _dispatch(self, skip: set[int]) -> None:
        """``concurrency`` lanes share one reader of the input; each lane runs one record at a time. This keeps
        exactly that many requests in flight with no task or semaphore per record."""
        records = pending_records(self.rt.blobs, self.batch, skip, self.settings.max_line_bytes)
        try:
            first = next(records, None)
            if first is None:
                return
            await asyncio.to_thread(self.rt.batches.mark_running, self.batch.id)
            queue = itertools.chain((first,), records)
            async with asyncio.TaskGroup() as lanes:
                for _ in range(self.spec.concurrency):
                    lanes.create_task(self._lane(queue))
        finally:
            records.close()

    async def _lane(self, queue: Iterator[tuple[int, dict[str, Any]]]) -> None:
        while True:
            if self._stopping or time.time() >= self.batch.expires_at:
                self._stopped_early = True
                return
            item = next(queue, None)
            if item is None:
                return
            try:
                await self._one(*item)
            except _Stopped:
                self._stopped_early = True
                return
            except LeaseLost:
                # The other lanes stop at their next step; their calls in flight finish rather than being
                # cancelled, since the HTTP client would carry a cancelled call on to its end anyway.
                self._lost = True
                return

    # -- one record ------------------------------------------------------------------------------------------

    async def _one(self, line: int, record: dict[str, Any]) -> None:
        custom_id = record["custom_id"]
        try:
            reply = await self._answer(record["body"])
        except _RecordFailed as exc:
            self._pending.err.append(error_line(custom_id, code=exc.code, message=exc.message))
        else:
            if 200 <= reply.status_code < 300:
                usage = reply.body.get("usage") if isinstance(reply.body.get("usage"), dict) else {}
                prompt, completion = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
                self._pending.out.append(output_line(custom_id, reply.body, catalog_model=self.spec.name))
                self._pending.input_tokens += prompt
                self._pending.output_tokens += completion
                self._pending.cost += self.price.cost(prompt, completion)
            else:
                self._pending.err.append(engine_error_line(custom_id, reply.status_code, reply.body))
        self._pending.lines.append(line)
        if len(self._pending.lines) >= self.settings.flush_records:
            await self._flush_or_retry_later()

    async def _answer(self, body: dict[str, Any]) -> EngineReply:
        """The record's final reply: one model call, or a tool loop of them (usage summed over its turns)."""
        ext = body.get("openrelay")
        tool_config = ext.get("tool_config") if isinstance(ext, dict) else None
        if tool_config is None:
            return await self._call_with_retries(_engine_body(body))
        # Imported here: the MCP SDK takes half a second to load, and only records that call tools need it.
        from .tools import ToolLoopFailed, run_tool_loop

        try:
            return await run_tool_loop(_engine_body(body), tool_config, self._call_with_retries, self.rt.catalog)
        except ToolLoopFailed as exc:
            raise _RecordFailed(exc.code, exc.message) from exc

    async def _call_with_retries(self, body: dict[str, Any]) -> EngineReply:
        """The engine's final answer to one request. 408/429/5xx and no answer are retried with backoff; when
        the attempts run out the gate decides between an outage (wait for the engine, attempts start over)
        and a failure of this record (the reply is its answer). Raises ``_Stopped`` when the batch stops."""
        endpoint = self.batch.endpoint
        attempt = 0
        answered_before = self.gate.answered
        failing = False
        sick_since: float | None = None
        try:
            while True:
                await self._wait_for_engine()
                try:
                    reply = await self.gate.call(endpoint, body)
                except EngineUnavailable as exc:
                    reply = EngineReply(503, error_body(exc.message, type_="server_error", code="engine_unavailable"))
                if not (reply.status_code in (408, 429) or reply.status_code >= 500):
                    self.gate.answered_ok()
                    return reply
                if self._lost:
                    raise _Stopped
                if not failing:
                    failing = True
                    self.gate.failing += 1
                attempt += 1
                if attempt >= self.settings.retry_attempts:
                    outage = await self.gate.outage(answered_before)
                    if outage is None:
                        return reply
                    if outage == "sick":
                        # The engine answers its probe but fails every call. That may be an outage of minutes,
                        # or records it can never serve: wait through it only so long.
                        sick_since = sick_since if sick_since is not None else time.monotonic()
                        if time.monotonic() - sick_since >= self.settings.sick_engine_seconds:
                            return reply
                    attempt, answered_before = 0, self.gate.answered
                    continue
                ENGINE_RETRIES.labels(self.spec.name).inc()
                delay = min(self.settings.retry_max_seconds, self.settings.retry_base_seconds * 2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        finally:
            if failing:
                self.gate.failing -= 1

    async def _wait_for_engine(self) -> None:
        """Return once the model's engine may be called. A started record finishes through a cancel (its retries
        and tool turns included) unless the engine is down; then cancel and expiry stop it unanswered."""
        while True:
            if self._lost:
                raise _Stopped
            if self.gate.is_open:
                return
            if self._cancel or time.time() >= self.batch.expires_at:
                raise _Stopped
            await self.gate.wait_open(min(self.settings.tick_seconds, self.batch.expires_at - time.time()))

    # -- durability and liveness -----------------------------------------------------------------------------

    async def _flush(self) -> None:
        """Make the finished records durable as the next chunk. If the write fails, the same chunk (same seq,
        same lines) is written again by the next flush, so no record is dropped or committed twice."""
        async with self._flush_lock:
            if self._unwritten is None:
                pending, self._pending = self._pending, _Pending()
                if not pending.lines:
                    return
                self._seq += 1
                self._unwritten = (self._seq, pending)
            seq, pending = self._unwritten
            await asyncio.to_thread(self._write_chunk, seq, pending)
            self._unwritten = None

    def _write_chunk(self, seq: int, pending: _Pending) -> None:
        out_key = err_key = None
        for lines, kind in ((pending.out, "out"), (pending.err, "err")):
            if lines:
                key = chunk_key(self.batch.id, seq, kind)
                with self.rt.blobs.writer(key) as handle:
                    handle.write(b"".join(lines))
                out_key, err_key = (key, err_key) if kind == "out" else (out_key, key)
        chunk = Chunk(seq=seq, out_key=out_key, err_key=err_key, lines=pending.lines, completed=len(pending.out),
                      failed=len(pending.err), input_tokens=pending.input_tokens,
                      output_tokens=pending.output_tokens, cost_nano_usd=pending.cost)
        self.rt.results.commit_chunk(self.batch.id, self.worker_id, self.batch.key_id, chunk)
        RECORDS.labels(self.spec.name, "completed").inc(chunk.completed)
        RECORDS.labels(self.spec.name, "failed").inc(chunk.failed)

    async def _flush_or_retry_later(self) -> None:
        """``_flush``, except that a store or disk hiccup leaves the chunk pending for the next flush. A lost
        lease still raises ``LeaseLost``."""
        try:
            await self._flush()
        except LeaseLost:
            raise
        except Exception:
            log.exception("batch %s: writing results failed; retrying", self.batch.id)

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_seconds)
            try:
                await self._flush_or_retry_later()
            except LeaseLost:
                self._lost = True
                return

    async def _heartbeat(self) -> None:
        """Watch for cancel every tick (a read); renew the lease every third of its length (a write). A store
        error is retried next tick; once the lease may have lapsed unrenewed, the run gives the batch up."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.tick_seconds)
            try:
                if time.monotonic() - renewed >= self.settings.lease_seconds / 3:
                    current = await asyncio.to_thread(self.rt.batches.renew_lease, self.batch.id, self.worker_id,
                                                      self.settings.lease_seconds)
                    renewed = time.monotonic()
                else:
                    current = await asyncio.to_thread(self.rt.batches.by_id, self.batch.id)
                    current = current if current.lease_owner == self.worker_id else None
            except Exception:
                log.exception("batch %s: heartbeat failed", self.batch.id)
                if time.monotonic() - renewed < self.settings.lease_seconds:
                    continue
                current = None
            if current is None:
                self._lost = True
                return
            self._cancel = current.status is BatchStatus.CANCELLING


def _engine_body(body: dict[str, Any]) -> dict[str, Any]:
    """What the model sees: the record's body without OpenRelay's own extensions."""
    if "openrelay" not in body:
        return body
    ext = {k: v for k, v in body["openrelay"].items() if k != "tool_config"}
    rest = {k: v for k, v in body.items() if k != "openrelay"}
    return {**rest, "openrelay": ext} if ext else rest


def _tokens(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and value > 0 else 0
