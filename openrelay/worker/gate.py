"""Engine outages: one gate per model in each worker process, shared by every batch of that model it runs.

A record whose retries run out is not failed at once: the gate first asks whether the engine itself is down.
It is down when its health probe gets no answer (or a 5xx), or when no call to it has succeeded since the record
started while other records failed too (an engine answering 5xx or 429 to everything). Then the gate closes:
every lane of the model waits at it, nothing is sent, and no record uses up attempts. It probes again after a
backoff that doubles up to a cap and opens when the probe passes; any answer that is not a failure resets the
backoff. A record fails with its engine's error only when the engine is otherwise answering, so one broken
record cannot pause a model, and an outage cannot burn a batch: what it costs is time in the window. One limit:
an engine that passes its probe yet fails every call ("sick") is waited for at most ``sick_engine_seconds`` per
record, since that is also what records it can never serve look like (a model that fails to load, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Literal

from ..config import Settings
from ..engines.base import Engine, EngineReply
from ..metrics import ENGINE_IN_FLIGHT, ENGINE_UP

__all__ = ["EngineGate", "Outage"]

Outage = Literal["down", "sick"]

log = logging.getLogger("openrelay.worker")

# Requests in flight per model, over every gate of this process; the gauge reads it when scraped, so a request
# costs two integer updates instead of two locked gauge updates.
_in_flight: dict[str, int] = {}


class EngineGate:
    def __init__(self, model: str, engine: Engine, settings: Settings) -> None:
        self.model = model
        self.engine = engine
        self.settings = settings
        self.answered = 0  # calls answered with anything but a retryable failure, ever
        self.failing = 0  # records now between their first retryable failure and their final answer
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

    async def wait_open(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the engine to be usable (callers look at ``is_open`` after)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), timeout=max(timeout, 0.0))

    async def call(self, endpoint: str, body: dict) -> EngineReply:
        _in_flight[self.model] += 1
        try:
            return await self.engine.call(endpoint, body)
        finally:
            _in_flight[self.model] -= 1

    def answered_ok(self) -> None:
        self.answered += 1
        self._backoff = self.settings.outage_base_seconds

    async def outage(self, answered_before: int) -> Outage | None:
        """A record ran out of attempts: is the engine down (close the gate; "down" when its probe fails,
        "sick" when it passes but every call fails), or is the record at fault (None)?"""
        if not self._open.is_set():
            return self._reason
        if not await self.engine.healthy():
            self._close("down")
        elif self.answered == answered_before and self.failing >= 2:
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
