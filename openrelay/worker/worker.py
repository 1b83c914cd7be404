"""A worker: claims batches from the store and runs, drains or finalizes them, and the scheduler's chores. Workers
share nothing but the store, so any number of them can run against one database and blob store."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import secrets
import time
from collections.abc import Callable

from .. import tracing
from ..backoff import Backoff
from ..catalog import ModelSpec
from ..clock import now_ns
from ..engines.base import Engine
from ..engines.factory import build_replicas, load_readers
from ..lifecycle import End, decide_end
from ..runtime import Runtime
from ..store.engine_limits import Learnt
from ..store.results import LeaseLost
from ..types import Batch, BatchStatus
from .dispatch import ModelGroups
from .finalize import end_failed_batch, finalize_batch
from .gate import EngineGate
from .limiter import ConcurrencyLimiter
from .replicas import Replica
from .run import BatchRun
from .share import Heartbeat

__all__ = ["Worker"]

log = logging.getLogger("openrelay.worker")

_KEEP_LIMITS_SECONDS = 5.0  # how often a worker writes what its adaptive limiters learnt (when it changed)


class Worker:
    def __init__(self, rt: Runtime, *,
                 build_engines: Callable[[ModelSpec], list[tuple[str, Engine]]] = build_replicas) -> None:
        """``build_engines``: a model's engine replicas as (name, engine); the catalog's, or a test's doubles."""
        self.rt = rt
        self._build_engines = build_engines
        self.worker_id = f"{os.uname().nodename}-{os.getpid()}-{secrets.token_hex(3)}"
        self.slots = {name: spec.slots for name, spec in rt.catalog.models.items()}
        self.capacity = sum(self.slots.values()) + 4  # room to end cancelled/expired batches meanwhile
        self._gates: dict[str, EngineGate] = {}
        self._groups: dict[str, ModelGroups] = {}  # per model: the prefix groups its runs send now
        self._active: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, str] = {}  # of those, the batches being run (not only ended), with their models
        self.heartbeat = Heartbeat(rt.workers, self.worker_id, self.slots, rt.settings.worker.lease_seconds)
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # a batch ended (a slot freed) or a stop: claim now, not at the next tick
        self.draining = False  # stopping: runs take no more records, finish their calls, hand their batches back
        self._limits_kept: dict[str, dict[str, Learnt]] = {}  # per model: what its limiters learnt, as last kept
        self._limits_kept_at = -math.inf

    def gate(self, model: str, learnt: dict[str, Learnt] | None = None) -> EngineGate:
        """The model's engine replicas, built on first use, behind the gate all its batches in this process
        share; with ``concurrency = "auto"`` each replica has its own limiter, which starts from what an earlier
        one of the replica ``learnt`` (``store/engine_limits.py``)."""
        if model not in self._gates:
            spec = self.rt.catalog.models[model]
            engines = self._build_engines(spec)
            capacity = -(-spec.concurrency * spec.slots // len(engines))  # a fixed limit's share, rounded up
            replicas = [Replica(model, name, engine, self.rt.settings, capacity=capacity,
                                limiter=_limiter(spec, (learnt or {}).get(name)))
                        for name, engine in engines]
            for replica, reader in zip(replicas, load_readers(spec), strict=False):
                replica.watch_load(reader, yields=spec.engine.get("yield_to_interactive", True))
            self._gates[model] = EngineGate(model, replicas, self.rt.settings, adaptive=spec.adaptive)
            self._groups[model] = ModelGroups()
        return self._gates[model]

    async def run_forever(self, *, burst: bool = False) -> None:
        """Claim and run batches until told to stop; with ``burst``, until nothing runs and the store has nothing
        this worker may take now (arq's burst mode: how tests drive a worker in process)."""
        await self.heartbeat.beat(force=True)  # counted among the live workers before its first claim
        log.info("worker %s serving %s", self.worker_id, ", ".join(sorted(self.slots)) or "(no models)")
        while not self._stop.is_set():
            try:
                await self.heartbeat.beat()
                await self.tick()
                await self.keep_learnt_limits()
            except Exception:  # keep the worker alive through a store hiccup; the next tick retries
                log.exception("worker tick failed")
            if burst and not self._active and not self._wake.is_set():  # a wake: a batch ended during the claim
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.rt.settings.worker.tick_seconds)
            self._wake.clear()

    async def tick(self) -> None:
        """Claim until the store has nothing for this worker (a claim also queues the batches validated since the
        last one: ``BatchLeases.claim``), or until this worker may start nothing more."""
        while len(self._active) < self.capacity and self.slots:
            started = now_ns()
            batch = await asyncio.to_thread(self.rt.leases.claim, self.worker_id, self.slots,
                                            self.rt.settings.worker.lease_seconds, frozenset(self._active),
                                            runs=self._may_run_more(), start_models=self._models_within_share())
            if batch is None:
                return  # no span: an empty claim every tick would bury the ones that found work
            tracing.span_since("batch claim", started, {"openrelay.batch_id": batch.id,
                                                        "openrelay.worker_id": self.worker_id,
                                                        "openrelay.status": batch.status.value})
            log.info("worker %s took batch %s (%s, %s)", self.worker_id, batch.id, batch.model, batch.status.value)
            task = asyncio.create_task(self._serve(batch))
            self._active[batch.id] = task
            if batch.status is BatchStatus.IN_PROGRESS:
                self._runs[batch.id] = batch.model
            task.add_done_callback(functools.partial(self._done, batch.id))
            if batch.from_queue and not (self._may_run_more() and self._models_within_share()):
                # No batch to end was waiting (the claim looks for those first), and this worker may start no
                # other: one more claim would find nothing. A batch to end that appears meanwhile waits a tick.
                return

    def _may_run_more(self) -> bool:
        max_batches = self.rt.settings.worker.max_batches
        return max_batches is None or len(self._runs) < max_batches

    def _done(self, batch_id: str, _task: asyncio.Task[None]) -> None:
        was_full = len(self._active) >= self.capacity
        self._active.pop(batch_id, None)
        if batch_id in self._runs or was_full:  # not already told by its end's commit (``_ended``)
            self._ended(batch_id)

    def _ended(self, batch_id: str) -> None:
        """The batch's end is committed (its slot is free in the store) or its task is done: the next queued batch
        need not wait a tick, nor the deletes of the blobs it no longer needs."""
        self._runs.pop(batch_id, None)
        self._wake.set()

    def _ended_from_thread(self, batch_id: str) -> Callable[[], None]:
        """``_ended`` for a finalizing on another thread to call; a no-op once the loop has closed."""
        loop = asyncio.get_running_loop()

        def ended() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing is left to claim for
                loop.call_soon_threadsafe(self._ended, batch_id)
        return ended

    def _models_within_share(self) -> list[str]:
        """The models this worker runs fewer batches of than its share of their slots (``worker/share.py``)."""
        running = list(self._runs.values())
        share = self.heartbeat.share
        return [model for model, slots in self.slots.items() if running.count(model) < share(model, slots)]

    async def _serve(self, batch: Batch) -> None:
        """Run or end the claimed batch; a run that fails is retried later (``_run_failed``)."""
        try:
            await self._run_or_end(batch)
        except LeaseLost:
            log.warning("batch %s: lease lost while finalizing; another worker takes it", batch.id)
        except Exception as exc:
            try:
                await asyncio.to_thread(self._run_failed, batch, exc)
            except Exception:  # the store is away too: the lease lapses and a later claim tries again
                log.exception("batch %s: recording its failed run failed", batch.id)

    def _run_failed(self, batch: Batch, exc: Exception) -> None:
        """A run that failed for a reason of its own (not one record's): retried after a backoff that doubles,
        the batch back in its queue meanwhile so it holds no slot; after ``run_attempts`` runs it ends."""
        settings = self.rt.settings
        failures = batch.run_failures + 1
        why = f"{exc.__class__.__name__}: {exc}"
        log.error("batch %s: run %d of %d failed: %s", batch.id, failures, settings.worker.run_attempts, why,
                  exc_info=exc if failures == 1 else None)
        if failures >= settings.worker.run_attempts:
            end_failed_batch(self.rt, self.worker_id, batch,
                             f"the batch could not be run ({failures} attempts); the last error: {why}")
            return
        runs = settings.worker
        delay = Backoff(base=runs.run_retry_base_seconds, cap=runs.run_retry_max_seconds).delay(failures)
        self.rt.leases.retry_later(batch.id, self.worker_id, failures=failures, delay=delay)

    async def _run_or_end(self, batch: Batch) -> None:
        """End the batch where its status or the catalog says it ends (cancelling, finalizing, model gone, past
        its window); otherwise run its records, on the model's gate (its limiters starting from the store's)."""
        spec = self.rt.catalog.models.get(batch.model)
        ended = self._ended_from_thread(batch.id)
        end = decide_end(batch.status, past_window=batch.past_window(), model_offered=spec is not None)
        if end is not None:
            errors = [{"code": "model_unavailable", "message": f'model "{batch.model}" is no longer offered',
                       "param": None, "line": None}] if end is End.FAILED else None  # only a model gone, here
            await asyncio.to_thread(finalize_batch, self.rt, self.worker_id, batch, end, errors, ended=ended)
        elif spec is not None:
            learnt = None
            if spec.adaptive and batch.model not in self._gates:
                learnt = await asyncio.to_thread(self.rt.limits.learnt, batch.model)
            gate = self.gate(batch.model, learnt)
            await BatchRun(self.rt, self.worker_id, batch, spec, gate, draining=lambda: self.draining,
                           groups=self._groups[batch.model], ended=ended).run()

    @property
    def stopping(self) -> asyncio.Event:
        """Set once the worker is told to stop: what runs beside it (the webhook deliveries, ``server.py``) stops
        with it."""
        return self._stop

    def request_stop(self) -> None:
        """Stop claiming (``run_forever`` returns) and take no new record from now on; ``stop`` then drains."""
        if not self._stop.is_set():
            log.info("worker %s stopping: its runs take no new record and finish their calls", self.worker_id)
        self._stop.set()
        self._wake.set()
        self.draining = True

    async def stop(self) -> None:
        """Drain: claim nothing more, let the calls in flight finish and become durable (for at most
        ``drain_seconds``, then they are cancelled and run again elsewhere), hand every batch back."""
        self.request_stop()
        held = list(self._active)
        active = list(self._active.values())
        if active:
            _done, late = await asyncio.wait(active, timeout=self.rt.settings.worker.drain_seconds)
            for task in late:
                task.cancel()
            await asyncio.gather(*active, return_exceptions=True)
        for batch_id in held:
            # A clean stop hands its batches back at once instead of leaving them until the lease lapses.
            await asyncio.to_thread(self.rt.leases.release, batch_id, self.worker_id)
        try:
            await self.heartbeat.leave()  # the others' shares grow at their next beat, not a lease later
        except Exception:  # the store is away: the row lapses with its lease
            log.exception("worker %s: leaving the live workers failed", self.worker_id)
        try:
            await self.keep_learnt_limits(force=True)
        except Exception:  # the store is away: a later worker starts from what was kept before
            log.exception("worker %s: keeping the learnt concurrency limits failed", self.worker_id)
        for gate in self._gates.values():
            await gate.aclose()

    async def keep_learnt_limits(self, *, force: bool = False) -> None:
        """What the adaptive limiters learnt goes to the store, every ``_KEEP_LIMITS_SECONDS`` (and when
        stopping), for the models whose limiters changed since."""
        clock = time.monotonic()
        if not force and clock < self._limits_kept_at + _KEEP_LIMITS_SECONDS:
            return
        self._limits_kept_at = clock
        for model, gate in self._gates.items():
            states = {replica.name: Learnt(*state) for replica in gate.replicas
                      if replica.limiter is not None and (state := replica.limiter.learnt()) is not None}
            if states and states != self._limits_kept.get(model):
                await asyncio.to_thread(self.rt.limits.save, model, states)
                self._limits_kept[model] = states


def _limiter(spec: ModelSpec, learnt: Learnt | None) -> ConcurrencyLimiter | None:
    if not spec.adaptive:
        return None
    initial, baseline = (None, None) if learnt is None else (learnt.limit, learnt.baseline_seconds)
    return ConcurrencyLimiter(min_limit=spec.min_concurrency, max_limit=spec.max_concurrency, initial=initial,
                              baseline=baseline)
