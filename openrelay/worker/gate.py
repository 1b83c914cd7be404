"""The engine gate: one per model in each worker process, shared by every batch of that model it runs. It routes
each request to a replica (a prefix group's home first), sends failed calls again (waits from ``backoff.Backoff``)
and takes a replica that is down or sick out of rotation. Why each rule is as it is: docs/design.md, "The engine
gate"."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .. import tracing
from ..backoff import Backoff
from ..config import Settings
from ..engines.base import EngineReply
from ..metrics import ENGINE_RETRIES
from .outcome import Outcome
from .replicas import Outage, Replica

__all__ = ["EngineGate", "Outage", "Stopped", "StopReason"]

StopReason = Literal["lost", "drained", "cancelled", "aborted", "expired"]


class Stopped(Exception):
    """A record left unanswered because its batch stops: its lease was lost (at once), or it was cancelled, ran
    out of its window or its worker is draining while the engine was not answering; ``unsent``: while it waited for
    room others' requests had on the engine (it is left unrun, as a record not yet taken)."""

    def __init__(self, reason: StopReason | Literal["unsent"]) -> None:
        super().__init__(reason)
        self.reason = reason


class EngineGate:
    def __init__(self, model: str, replicas: Sequence[Replica], settings: Settings, *,
                 adaptive: bool = False) -> None:
        if not replicas:
            raise ValueError(f"model {model!r} has no engine replica")
        self.model = model
        self.replicas = tuple(replicas)
        self.settings = settings
        self.adaptive = adaptive
        # Records that failed together (an engine that stumbled) retry spread over the lower half of the wait.
        self._retries = Backoff(base=settings.engines.retry_base_seconds, cap=settings.engines.retry_max_seconds,
                                jitter=(0.5, 1.0))

    @property
    def is_open(self) -> bool:
        return any(r.is_open for r in self.replicas)

    @property
    def limit(self) -> int:
        """Requests the open replicas take at once now: the sum of their limits."""
        return sum(r.own_limit for r in self.replicas if r.is_open)

    @property
    def room(self) -> int | None:
        """While a replica leaves room to others' requests (``yield_to_interactive``): the requests the open
        replicas take now, less that room; else None."""
        open_ = [r for r in self.replicas if r.is_open]
        return sum(r.limit for r in open_) if any(r.yielding for r in open_) else None

    async def answer(self, endpoint: str, body: dict[str, Any], stop_reason: Callable[[], StopReason | None],
                     group: int = 0) -> EngineReply:
        """The engine's final answer to one request of prefix group ``group`` (0: none). Raises ``Stopped``
        when the lease is lost, or when the batch is cancelled or out of its window while every replica is out;
        a started record otherwise finishes."""
        attempt = 0
        failed_on: dict[Replica, float] = {}  # the replicas this record failed on, with its first failure there
        sick_since: float | None = None
        overloaded_since: float | None = None
        overloads = 0
        avoid: Replica | None = None
        try:
            while True:
                replica = await self._pick(group, stop_reason, avoid)
                sent = time.monotonic()
                where = {"openrelay.model": self.model, "openrelay.replica": replica.name}
                with tracing.span("engine call", where) as span:  # a retry is a span of its own
                    reply, outcome = await replica.send(endpoint, body)
                    if span is not None:
                        span.set_attributes({"http.response.status_code": reply.status_code,
                                             "openrelay.outcome": outcome})
                if outcome.final:
                    replica.answered(sent)
                    return reply
                if stop_reason() == "lost":
                    raise Stopped("lost")
                if replica not in failed_on:
                    failed_on[replica] = time.monotonic()
                    replica.failing += 1
                others = len(self.replicas) > 1 and any(r.is_open and r is not replica for r in self.replicas)
                if outcome is not Outcome.OVERLOAD and len(self.replicas) > 1:
                    replica.suspect()
                if outcome is Outcome.OVERLOAD and self.adaptive:
                    overloaded_since = overloaded_since if overloaded_since is not None else time.monotonic()
                    if time.monotonic() - overloaded_since < self.settings.engines.sick_engine_seconds:
                        overloads += 1
                        ENGINE_RETRIES.labels(self.model).inc()
                        avoid = replica if others else None
                        await asyncio.sleep(self._retries.delay(min(overloads, 8)))
                        continue
                attempt += 1
                if attempt < self.settings.engines.retry_attempts:
                    ENGINE_RETRIES.labels(self.model).inc()
                    if others and outcome is not Outcome.OVERLOAD:
                        avoid = replica  # another replica may answer at once: no reason to wait
                        continue
                    avoid = None
                    await asyncio.sleep(self._retries.delay(attempt))
                    continue
                outage = await replica.outage(failed_on[replica])
                if outage is None:
                    return reply
                if outage == "sick":
                    sick_since = sick_since if sick_since is not None else time.monotonic()
                    if time.monotonic() - sick_since >= self.settings.engines.sick_engine_seconds:
                        return reply
                attempt, avoid = 0, None
        finally:
            for replica in failed_on:
                replica.failing -= 1

    async def _pick(self, group: int, stop_reason: Callable[[], StopReason | None],
                    avoid: Replica | None) -> Replica:
        """An open replica for a record of ``group``; waits while every replica is out, or held back for others'
        requests on it (``yield_to_interactive``)."""
        while True:
            reason = stop_reason()
            if reason == "lost":
                raise Stopped(reason)
            open_ = [r for r in self.replicas if r.is_open]
            for replica in open_:
                await replica.load_known()
            ready = [r for r in open_ if not r.held_back]
            if ready:
                return _choose(ready, group, avoid)
            if reason is not None:
                raise Stopped("unsent" if open_ else reason)
            tick = self.settings.worker.tick_seconds
            waits = [asyncio.ensure_future(r.wait_room(tick) if r.is_open else r.wait_open(tick))
                     for r in self.replicas]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*waits, return_exceptions=True)

    async def aclose(self) -> None:
        for replica in self.replicas:
            await replica.aclose()


def _choose(open_: list[Replica], group: int, avoid: Replica | None) -> Replica:
    if len(open_) == 1:
        return open_[0]
    candidates = [r for r in open_ if r is not avoid] or open_
    if group:
        home = max(candidates, key=lambda r: r.score(group))
        if not home.saturated:
            return home
    return max(candidates, key=lambda r: r.headroom)
