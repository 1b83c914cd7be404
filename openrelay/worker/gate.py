"""The engine gate: the one home of the retry and outage policy, one gate per model in each worker process, shared
by every batch of that model it runs.

``answer`` sends one request and returns the engine's final reply. 408, 429, 5xx and no answer at all are retried
with backoff. When a record's attempts run out the gate asks whether the engine itself is down before failing it:
- **down**: its health probe gets no answer (or a 5xx);
- **sick**: the probe passes, but no call sent after this record's first failure has succeeded while other records
  fail too (an engine answering 500 to everything while its ``/v1/models`` is up).
Then the gate closes: every lane of the model waits at it, nothing is sent, and no record uses up attempts. It
probes again after a backoff that doubles up to a cap and opens when the probe passes; any answer that is not a
failure resets the backoff. A record fails with its engine's error only when the engine answers others meanwhile
(or it is the only record failing), so one broken record cannot pause a model, and an outage cannot burn a batch:
what it costs is time in the window. One limit: a sick engine is waited for at most ``sick_engine_seconds`` per
record, since that is also what records it can never serve look like (a model that fails to load, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Literal

from ..config import Settings
from ..engines.base import Engine, EngineReply, EngineUnavailable, error_body
from ..metrics import ENGINE_IN_FLIGHT, ENGINE_RETRIES, ENGINE_UP

__all__ = ["EngineGate", "Outage", "Stopped", "StopReason"]

Outage = Literal["down", "sick"]
StopReason = Literal["lost", "drained", "cancelled", "expired"]

log = logging.getLogger("openrelay.worker")

# Requests in flight per model, over every gate of this process; the gauge reads it when scraped, so a request
# costs two integer updates instead of two locked gauge updates.
_in_flight: dict[str, int] = {}


class Stopped(Exception):
    """A record left unanswered because its batch stops: its lease was lost (at once), or it was cancelled, ran
    out of its window or its worker is draining while the engine was not answering."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


class EngineGate:
    def __init__(self, model: str, engine: Engine, settings: Settings) -> None:
        self.model = model
        self.engine = engine
        self.settings = settings
        self.failing = 0  # records now between their first retryable failure and their final answer
        self._last_ok_sent = 0.0  # monotonic send time of the latest-sent call that got a non-failure answer
        self._open = asyncio.Event()
        self._open.set()
        self._backoff = settings.outage_base_seconds
        self._prober: asyncio.Task[None] | None = None
        self._reason: Outage = "down"
        if model not in _in_flight:
            _in_flight[model] = 0
            ENGINE_IN_FLIGHT.labels(model).set_function(lambda: _in_flight[model])
        ENGINE_UP.labels(model).set(1)

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def answer(self, endpoint: str, body: dict[str, Any],
                     stop_reason: Callable[[], StopReason | None]) -> EngineReply:
        """The engine's final answer to one request. Raises ``Stopped`` when the lease is lost, or when the batch
        is cancelled or out of its window while the gate is closed; a started record otherwise finishes."""
        attempt = 0
        first_failure: float | None = None
        sick_since: float | None = None
        try:
            while True:
                await self._wait_until_open(stop_reason)
                sent = time.monotonic()
                reply = await self._send(endpoint, body)
                if not _retryable(reply.status_code):
                    self._last_ok_sent = max(self._last_ok_sent, sent)
                    self._backoff = self.settings.outage_base_seconds
                    return reply
                if stop_reason() == "lost":
                    raise Stopped("lost")
                if first_failure is None:
                    first_failure = time.monotonic()
                    self.failing += 1
                attempt += 1
                if attempt < self.settings.retry_attempts:
                    ENGINE_RETRIES.labels(self.model).inc()
                    await asyncio.sleep(self._retry_delay(attempt))
                    continue
                outage = await self._outage(first_failure)
                if outage is None:
                    return reply
                if outage == "sick":
                    sick_since = sick_since if sick_since is not None else time.monotonic()
                    if time.monotonic() - sick_since >= self.settings.sick_engine_seconds:
                        return reply
                attempt = 0
        finally:
            if first_failure is not None:
                self.failing -= 1

    def _retry_delay(self, attempt: int) -> float:
        delay = min(self.settings.retry_max_seconds, self.settings.retry_base_seconds * 2 ** (attempt - 1))
        return delay * random.uniform(0.5, 1.0)

    async def _send(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        _in_flight[self.model] += 1
        try:
            return await self.engine.call(endpoint, body)
        except EngineUnavailable as exc:
            return EngineReply(503, error_body(exc.message, type_="server_error", code="engine_unavailable"))
        finally:
            _in_flight[self.model] -= 1

    async def _wait_until_open(self, stop_reason: Callable[[], StopReason | None]) -> None:
        while True:
            reason = stop_reason()
            if reason == "lost":
                raise Stopped(reason)
            if self._open.is_set():
                return
            if reason is not None:
                raise Stopped(reason)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._open.wait(), timeout=self.settings.tick_seconds)

    async def _outage(self, first_failure: float) -> Outage | None:
        """A record ran out of attempts: is the engine down or sick (close the gate), or is the record at fault
        (None)? Only calls sent after the record's first failure tell: an answer to a call sent earlier may
        land after an engine turned sick."""
        if not self._open.is_set():
            return self._reason
        if not await self.engine.healthy():
            self._close("down")
        elif self._last_ok_sent <= first_failure and self.failing >= 2:
            self._close("sick")
        else:
            return None
        return self._reason

    def _close(self, reason: Outage) -> None:
        if not self._open.is_set():
            return
        why = "its health probe failed" if reason == "down" else "it fails every call"
        log.warning("engine of %s looks down (%s): pausing its dispatch", self.model, why)
        self._reason = reason
        self._open.clear()
        ENGINE_UP.labels(self.model).set(0)
        self._prober = asyncio.create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        started = time.monotonic()
        while True:
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, self.settings.outage_max_seconds)
            if await self.engine.healthy():
                break
        log.info("engine of %s answers again after %.1f s: resuming its dispatch", self.model,
                 time.monotonic() - started)
        ENGINE_UP.labels(self.model).set(1)
        self._open.set()

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
        await self.engine.aclose()
