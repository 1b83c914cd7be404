"""One engine replica as a worker process sees it (one per ``base_urls`` entry): its own health, in-flight count
and limit. A replica down (its probe gets no answer) or sick (it fails every call while its probe passes) is out of
rotation until its prober sees it answer again (docs/design.md, "The engine gate")."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import Any, Literal

from ..backoff import Backoff
from ..config import Settings
from ..engines.base import Engine, EngineReply, EngineUnavailable
from ..engines.load_metrics import MetricsReader
from ..errors import error_envelope
from ..metrics import ENGINE_CONCURRENCY_LIMIT, ENGINE_IN_FLIGHT, ENGINE_UP
from .engine_load import EngineLoad
from .limiter import ConcurrencyLimiter
from .outcome import Outcome, outcome_of

__all__ = ["Replica", "Outage"]

Outage = Literal["down", "sick"]

log = logging.getLogger("openrelay.worker")


class Replica:
    def __init__(self, model: str, name: str, engine: Engine, settings: Settings, *,
                 limiter: ConcurrencyLimiter | None, capacity: int) -> None:
        self.model = model
        self.name = name  # the replica's base URL ("local" for an in-process engine): its metrics label
        self.engine = engine
        self.settings = settings
        self.limiter = limiter
        self.capacity = capacity  # requests it takes at once before load spills to another (fixed concurrency)
        self.in_flight = 0
        self.load: EngineLoad | None = None  # the engine's own load, with ``load_metrics`` (``watch_load``)
        self._room = asyncio.Event()  # set (and replaced) when a call ends or the load is read: room may have come
        self.failing = 0  # records now between their first retryable failure here and their final answer
        self.last_ok_sent = 0.0  # monotonic send time of the latest-sent call here that got a non-failure answer
        self.reason: Outage = "down"
        self._open = asyncio.Event()
        self._open.set()
        self._probes = Backoff(base=settings.engines.outage_base_seconds, cap=settings.engines.outage_max_seconds)
        self._probe_rounds = 0  # waits for a probe since a call here last got an answer (the backoff grows)
        self._prober: asyncio.Task[None] | None = None
        self._checking: asyncio.Task[None] | None = None
        self._seed = hashlib.blake2b(name.encode(), digest_size=8).digest()
        ENGINE_UP.labels(model, name).set(1)
        ENGINE_IN_FLIGHT.labels(model, name).set_function(lambda: self.in_flight)
        ENGINE_CONCURRENCY_LIMIT.labels(model, name).set_function(lambda: self.limit)

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def watch_load(self, reader: MetricsReader, *, yields: bool) -> None:
        """Read the engine's own load (``load_metrics``) while the replica is in use; with ``yields``, leave
        others' requests room (``worker/engine_load.py``)."""
        self.load = EngineLoad(self.model, self.name, reader, yields=yields, ours=lambda: self.in_flight,
                               own_limit=lambda: self.own_limit, on_read=self._room_changed)

    @property
    def own_limit(self) -> int:
        """The calls it takes at once by its limiter or its share of the fixed concurrency."""
        return self.limiter.limit if self.limiter is not None else self.capacity

    @property
    def limit(self) -> int:
        """``own_limit``, less the room left to others' requests on the engine."""
        return self.own_limit if self.load is None else self.load.room()

    @property
    def yielding(self) -> bool:
        return self.load is not None and self.load.yielding

    @property
    def held_back(self) -> bool:
        """Yielding with no room left: no new call goes to it."""
        return self.load is not None and self.headroom <= 0 and self.yielding

    async def load_known(self) -> None:
        """Before a call is sent to it: its load read, if it has load metrics."""
        if self.load is not None:
            await self.load.in_use()

    async def wait_room(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), timeout)

    def _room_changed(self) -> None:
        self._room.set()
        self._room = asyncio.Event()

    @property
    def saturated(self) -> bool:
        return self.in_flight >= self.limit

    @property
    def headroom(self) -> int:
        return self.limit - self.in_flight

    def score(self, group: int) -> bytes:
        """Rendezvous (highest random weight) hashing: the open replica with the highest score for a prefix
        group is its home, so each replica's prefix cache serves its own groups, and a replica leaving or
        coming back moves only the groups it wins."""
        return hashlib.blake2b(group.to_bytes(8, "little"), digest_size=8, key=self._seed).digest()

    async def wait_open(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), timeout)

    async def send(self, endpoint: str, body: dict[str, Any]) -> tuple[EngineReply, Outcome]:
        """One call, inside this replica's limiter when the model's concurrency is adaptive."""
        token = await self.limiter.acquire() if self.limiter is not None else None
        outcome = Outcome.IGNORE  # a cancelled call teaches the limiter nothing
        self.in_flight += 1
        try:
            try:
                reply = await self.engine.call(endpoint, body)
            except EngineUnavailable as exc:
                outcome = outcome_of(exc)
                return EngineReply(503, error_envelope(exc.message, type_="server_error",
                                                       code="engine_unavailable")), outcome
            outcome = outcome_of(reply)
            return reply, outcome
        finally:
            self.in_flight -= 1
            self._room_changed()
            if token is not None:
                assert self.limiter is not None
                self.limiter.release(token, outcome)

    def answered(self, sent: float) -> None:
        """A call sent at ``sent`` got an answer that is not a failure."""
        self.last_ok_sent = max(self.last_ok_sent, sent)
        self._probe_rounds = 0

    def suspect(self) -> None:
        """A call got no answer or a 5xx: probe once now, so a replica that died leaves rotation at once and
        its records go to the others, instead of after a record's every attempt."""
        if self._open.is_set() and (self._checking is None or self._checking.done()):
            self._checking = asyncio.create_task(self._check())

    async def _check(self) -> None:
        if not await self.engine.healthy():
            self.close("down")

    async def outage(self, first_failure: float) -> Outage | None:
        """A record ran out of attempts here: is the replica down or sick (close it), or is the record at fault
        (None)? Only calls sent after the record's first failure tell: an answer to a call sent earlier may land
        after the replica turned sick."""
        if not self._open.is_set():
            return self.reason
        if not await self.engine.healthy():
            self.close("down")
        elif self.last_ok_sent <= first_failure and self.failing >= 2:
            self.close("sick")
        else:
            return None
        return self.reason

    def close(self, reason: Outage) -> None:
        if not self._open.is_set():
            return
        why = "its health probe failed" if reason == "down" else "it fails every call"
        log.warning("engine of %s at %s looks down (%s): taking it out of rotation", self.model, self.name, why)
        self.reason = reason
        self._open.clear()
        ENGINE_UP.labels(self.model, self.name).set(0)
        self._prober = asyncio.create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        started = time.monotonic()
        while True:
            self._probe_rounds += 1
            await asyncio.sleep(self._probes.delay(self._probe_rounds))
            if await self.engine.healthy():
                break
        log.info("engine of %s at %s answers again after %.1f s: back in rotation", self.model, self.name,
                 time.monotonic() - started)
        ENGINE_UP.labels(self.model, self.name).set(1)
        self._open.set()

    async def aclose(self) -> None:
        for task in (self._prober, self._checking):
            if task is not None:
                task.cancel()
        if self.load is not None:
            await self.load.aclose()
        await self.engine.aclose()
