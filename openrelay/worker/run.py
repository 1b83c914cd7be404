"""Running one claimed batch: keep ``concurrency`` requests in flight, then finalize it from what its records hold.
The ``EngineGate`` owns retries and outages, the ``ChunkWriter`` makes finished records durable, the ``LeaseKeeper``
renews the lease and sees a cancel. Whatever a record raises becomes its own error line; the terminal status is
decided at the end from the store's counts (``lifecycle.decide_end``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from .. import tracing
from ..catalog import ModelSpec
from ..engines.base import EngineReply
from ..failure_threshold import FailureThreshold
from ..ids import new_record_request_id
from ..lifecycle import End, decide_end
from ..metrics import RUNNING_BATCHES
from ..runtime import Runtime
from ..store.results import Chunk, LeaseLost
from ..types import Batch, Rejection
from .abort import AbortWatch
from .billing import Billing, NoRoom
from .chunks import ChunkWriter
from .dispatch import DispatchQueue, ModelGroups, Pending
from .finalize import finalize_batch
from .gate import EngineGate, Stopped, StopReason
from .inputs import Unreadable, read_rejections
from .lease import LeaseKeeper
from .lines import engine_error_line, error_line, output_line, unrun_line
from .tool_errors import ToolLoopFailed

__all__ = ["BatchRun", "RunIncomplete"]

log = logging.getLogger("openrelay.worker")

# How a record stopped mid-flight by the batch ends (it had started: "before this request started" would be untrue).
_STOPPED_ENDS = {"cancelled": End.CANCELLED, "expired": End.EXPIRED, "aborted": End.ABORTED}


class RunIncomplete(Exception):
    """The run ended with records unrun and no reason to leave them: the run failed, and is tried again."""


class BatchRun:
    def __init__(self, rt: Runtime, worker_id: str, batch: Batch, spec: ModelSpec, gate: EngineGate,
                 draining: Callable[[], bool] = lambda: False, groups: ModelGroups | None = None,
                 ended: Callable[[], None] | None = None) -> None:
        self.rt = rt
        self.worker_id = worker_id
        self.batch = batch
        self.spec = spec
        self.gate = gate
        self.billing = Billing(batch, spec, spec.price(rt.catalog.factor(batch.priority)))
        self.settings = rt.settings
        self.keeper = LeaseKeeper(rt.leases, rt.settings.worker, batch.id, worker_id)
        self._draining = draining  # the worker is stopping: take no more records, hand the batch back
        self.groups = groups or ModelGroups()  # the model's prefix groups in this worker, over its batches
        self._ended = ended  # told (on the finalizing's thread) once the batch's end is committed
        self._chunks: list[Chunk] = []  # the chunks durable before this run began
        self.writer: ChunkWriter | None = None
        self._writing: asyncio.Task[None] | None = None
        self._publishing: asyncio.Task[None] | None = None  # from the first record on (``_dispatch``)
        self.abort = AbortWatch(batch.id, FailureThreshold.of(batch.failure_threshold))

    # -- the whole run ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        chunks, rejections = await asyncio.to_thread(self._ran_before)
        self._chunks = chunks
        skip = {line for c in chunks for line in c.lines} | {r.line for r in rejections}
        self.abort.ran_before(chunks)
        writer = self.writer = ChunkWriter(self.rt, self.batch, self.worker_id,
                                           last_seq=max((c.seq for c in chunks), default=0), model=self.spec.name)
        keeping = asyncio.create_task(self.keeper.run())
        writing = self._writing = asyncio.create_task(writer.run(lambda: self.keeper.lost))
        RUNNING_BATCHES.labels(self.spec.name).inc()
        try:
            dispatched = False
            try:
                await self._dispatch(skip)
                dispatched = True
            finally:
                writer.close(ends_run=dispatched and self.abort.error is None)
                await writing  # everything finished is durable before the run finalizes or fails
        except LeaseLost:
            self.keeper.lost = True
        finally:
            for task in (keeping, writing, self._publishing):
                if task is not None:
                    task.cancel()
            with contextlib.suppress(BaseException):
                await writing
            RUNNING_BATCHES.labels(self.spec.name).dec()
        if self.keeper.lost:
            log.warning("batch %s: lease lost; another worker resumes it", self.batch.id)
            return
        await asyncio.to_thread(self._finalize)

    def _ran_before(self) -> tuple[list[Chunk], list[Rejection]]:
        """What needs no run: the chunks already durable, and the records the create rejected."""
        return self.rt.results.chunks(self.batch.id), read_rejections(self.rt.blobs, self.batch)

    async def _mark_running(self, limit: int | None) -> None:
        """``BatchLeases.mark_running`` while the first record goes out, then the limit kept shown as it changes."""
        await asyncio.to_thread(self.rt.leases.mark_running, self.batch.id, self.worker_id, limit)
        self._publishing = asyncio.create_task(self._publish_limit(limit))

    async def _publish_limit(self, limit: int | None) -> None:
        """Keep the row's ``concurrency_limit`` and ``yielding`` as the progress object shows them
        (docs/progress-and-dry-run.md), from ``limit``, what ``mark_running`` wrote: at most once a second, when
        they change; a failed write is tried at the next change."""
        shown: tuple[int | None, bool | None] = (limit, None)  # a resumed run may find ``yielding`` left set
        while True:
            await asyncio.sleep(max(1.0, self.settings.worker.tick_seconds))
            room = self.gate.room  # records wait for it at the gate, taken from the queue: they go as it comes
            now = (self._concurrency_now(), False) if room is None else (min(room, self._concurrency_now()), True)
            if now != shown:
                try:
                    await asyncio.to_thread(self.rt.leases.set_concurrency_limit, self.batch.id, self.worker_id,
                                            *now)
                    shown = now
                except Exception as exc:  # noqa: BLE001 - the store is away: progress can wait, the run goes on
                    log.debug("batch %s: showing its concurrency failed: %s", self.batch.id, exc)

    def _concurrency_now(self) -> int:
        return self.gate.limit if self.spec.adaptive else self.spec.concurrency

    def _finalize(self) -> None:
        """The terminal status, from the store's counts after the last write (``lifecycle.decide_end``). The chunks
        the finalizing composes are those read when the run began and those it committed since: no other run
        commits one while this one holds the lease (``Results.commit_chunk`` is fenced by it)."""
        assert self.writer is not None
        current = self.writer.ended  # the run's last chunk ended it; else (no chunk since it closed) it ends here
        if current is None:
            current = self.rt.leases.end_run(self.batch.id, self.worker_id, may_complete=not self.abort.aborted)
        end = decide_end(current.status, past_window=self.batch.past_window(), aborted=self.abort.aborted)
        unrun = current.total - current.completed - current.failed
        if end is not None:
            errors = [self.abort.error] if end is End.ABORTED and self.abort.error else None
            finalize_batch(self.rt, self.worker_id, self.batch, end, errors,
                           chunks=self._chunks + self.writer.committed, ended=self._ended)
        elif self._draining():
            log.info("batch %s: %d records left for the next worker (this one is stopping)", self.batch.id, unrun)
        else:
            raise RunIncomplete(f"the run ended with {unrun} records unrun")

    def _stop_reason(self) -> StopReason | None:
        if self.keeper.lost or (self._writing is not None and self._writing.done()):
            return "lost"  # the writer ends early only on a lost lease: nothing more would become durable
        if self.abort.aborted:
            return "aborted"
        if self._draining():
            return "drained"
        if self.keeper.cancelled:
            return "cancelled"
        if self.batch.past_window():
            return "expired"
        return None

    async def _dispatch(self, skip: set[int]) -> None:
        """``concurrency`` lanes share one queue of the batch's records (worker/dispatch.py: prefix groups back
        to back); each lane runs one record at a time. This keeps exactly that many requests in flight with no
        task or semaphore per record (with ``concurrency = "auto"``, as many as the engine's limiter lets go)."""
        queue = DispatchQueue(self.rt.blobs, self.batch, skip, self.settings.batches.max_line_bytes,
                              grouping=self.spec.prefix_grouping, groups=self.groups, in_flight=self._concurrency_now)
        try:
            if self._stop_reason() is not None:
                return  # resumed after its failure_threshold stopped it: nothing more starts
            first = await queue.take()
            if first is None:
                return
            try:
                async with asyncio.TaskGroup() as lanes:
                    # The batch is marked running as its first record goes out, not before: the write is not on
                    # the way of a small batch's only record. Its failure stops the run (the records in flight are
                    # run again), as a failed write of results does.
                    lanes.create_task(self._mark_running(self._concurrency_now()))
                    lanes.create_task(self._lane(queue, first))
                    for _ in range(self.spec.concurrency - 1):
                        lanes.create_task(self._lane(queue))
            except BaseExceptionGroup as group:
                raise group.exceptions[0] from None  # the first lane's failure says why; the others share it
        finally:
            queue.close()

    async def _lane(self, queue: DispatchQueue, first: Pending | None = None) -> None:
        assert self.writer is not None
        item = first
        while self._stop_reason() is None:
            if item is None:
                if not await self.writer.wait_for_room(self.settings.worker.tick_seconds):
                    continue
                item = await queue.take()
                if item is None:
                    return
                if self._stop_reason() is not None:
                    return  # stopped while the lane waited for a record: it stays unrun
            line, record, group = item
            item = None
            self.groups.started(group)
            try:
                if not await self._run_record(line, record, group):
                    return
            finally:
                self.groups.finished(group)
                queue.done(group)

    # -- one record ------------------------------------------------------------------------------------------

    async def _run_record(self, line: int, record: dict[str, Any] | Unreadable, group: int = 0) -> bool:
        """Run one record and hand its line to the writer; False when the batch stopped it unanswered."""
        assert self.writer is not None
        if isinstance(record, Unreadable):
            self.writer.add_error(line, error_line(record.custom_id, code="invalid_request_error",
                                                   message=record.message, status_code=400))
            self.abort.settled(failed=True)
            return True
        custom_id = record["custom_id"]
        request_id = new_record_request_id()
        try:
            async with self.billing.holding(line, record["body"]) as hold:
                with tracing.engine_calls(request_id, self.batch.id, line):
                    reply = await self._answer(record["body"], group)
                if 200 <= reply.status_code < 300:
                    usage, cost = self.billing.bill(hold, reply.body)
                    data = output_line(custom_id, reply.body, catalog_model=self.spec.name, request_id=request_id)
                    self.writer.add_output(line, data, usage=usage, cost=cost)
                    self.abort.settled(failed=False)
                else:
                    self.writer.add_error(line, engine_error_line(custom_id, reply.status_code, reply.body,
                                                                  request_id))
                    self.abort.settled(failed=True)
        except Stopped as stop:
            if stop.reason in _STOPPED_ENDS:  # lost or drained: the record runs again where the batch goes
                self.writer.add_error(line, unrun_line(custom_id, _STOPPED_ENDS[stop.reason], waiting=True))
            return False
        except (ToolLoopFailed, NoRoom) as exc:  # a tool loop's failure, or no budget: an error line of its code
            self.writer.add_error(line, error_line(custom_id, code=exc.code, message=str(exc)))
            self.abort.settled(failed=True)
        except Exception as exc:  # noqa: BLE001 - whatever else breaks is this record's failure, not the batch's
            log.exception("batch %s: record at line %d failed", self.batch.id, line)
            self.writer.add_error(line, error_line(
                custom_id, code="server_error", status_code=500,
                message=f"the request could not be run: {exc.__class__.__name__}: {exc}"[:2000]))
            self.abort.settled(failed=True)
        return True

    async def _answer(self, body: dict[str, Any], group: int) -> EngineReply:
        """The record's final reply: one model call, or a tool loop of them (usage summed over its turns)."""
        ext = body.get("openrelay")
        tool_config = ext.get("tool_config") if isinstance(ext, dict) else None
        if tool_config is None:
            return await self._call(_engine_body(body), group)
        # Imported here: the MCP SDK takes half a second to load, and only records that call tools need it.
        from .tools import run_tool_loop

        call = functools.partial(self._call, group=group)
        return await run_tool_loop(_engine_body(body), tool_config, call, self.rt.catalog, self.batch.endpoint)

    async def _call(self, body: dict[str, Any], group: int = 0) -> EngineReply:
        return await self.gate.answer(self.batch.endpoint, body, self._stop_reason, group)


def _engine_body(body: dict[str, Any]) -> dict[str, Any]:
    """What the model sees: the record's body without OpenRelay's own extensions."""
    if "openrelay" not in body:
        return body
    ext = {k: v for k, v in body["openrelay"].items() if k != "tool_config"}
    rest = {k: v for k, v in body.items() if k != "openrelay"}
    return {**rest, "openrelay": ext} if ext else rest

