"""An engine replica's load as this worker process reads it (``load_metrics`` in the catalog), and how many calls
the process may have on it while others' requests share it (``yield_to_interactive``). The rule and why:
docs/engines.md, "Sharing an engine with interactive traffic"."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..engines.load_metrics import MetricsReader
from ..metrics import ENGINE_KV_CACHE_USAGE, ENGINE_LOAD, ENGINE_LOAD_READABLE, ENGINE_YIELDING

__all__ = ["EngineLoad", "Reading", "room", "LINGER_SECONDS"]

log = logging.getLogger("openrelay.worker")

READ_SECONDS = 0.25  # how often a replica in use is read
_IDLE_SECONDS = 5.0  # a replica with no call of ours for this long is read no more (until the next)
LINGER_SECONDS = 3.0  # after others' requests were last seen, their slot stays free this long: one every few s


@dataclass(frozen=True, slots=True)
class Reading:
    running: int  # requests the engine runs now, ours among them
    waiting: int  # requests queued on the engine, ours among them
    ours: int  # this process's calls in flight on the replica as it was read
    kv_cache_usage: float | None = None

    @property
    def others(self) -> int:
        """Requests on the engine that are not this process's (never below 0: an answer may be on its way)."""
        return max(0, self.running + self.waiting - self.ours)


def room(limit: int, reading: Reading | None, full: int | None, lately: bool = False) -> int:
    """How many calls this process may have in flight on the replica, ``limit`` its own limit there: all of it
    while only its requests are on the engine (or no reading is known) and others' were not seen ``lately``; none
    while others' requests may be waiting; while they run or were seen lately, as many as keep one of the engine's
    slots free (``full``: how many it ran when it last made a request wait; unknown, no cap)."""
    if reading is None:
        return limit
    if reading.others == 0:
        return limit if full is None or not lately else max(0, min(limit, full - 1))
    if reading.waiting > 0:
        return 0
    return limit if full is None else max(0, min(limit, full - 1 - reading.others))


class EngineLoad:
    """One replica's load as this process reads it, every ``READ_SECONDS`` while it is in use. A read that fails
    or cannot be parsed leaves no reading (the replica runs as without load metrics), said once in the log and by
    ``readable``."""

    def __init__(self, model: str, replica: str, reader: MetricsReader, *, yields: bool, ours: Callable[[], int],
                 own_limit: Callable[[], int], on_read: Callable[[], None] = lambda: None) -> None:
        """``ours``: this process's calls in flight on the replica; ``own_limit``: how many it may have there
        without load metrics; ``on_read``: told after each read."""
        self.model, self.replica, self.reader = model, replica, reader
        self.yields = yields
        self.reading: Reading | None = None
        self.full: int | None = None  # requests the engine ran when it last made one wait: its slots, as seen
        self.readable = True
        self._ours = ours
        self._own_limit = own_limit
        self._on_read = on_read
        self._warned = False
        self._used = -math.inf
        self._others_seen = -math.inf  # when a reading last showed others' requests
        self._task: asyncio.Task[None] | None = None
        self._first_read: asyncio.Future[None] | None = None  # done once reading, since it last started, read

        labels = (model, replica)
        for state in ("running", "waiting", "ours"):
            ENGINE_LOAD.labels(*labels, state).set_function(functools.partial(self._as_read, state))
        ENGINE_KV_CACHE_USAGE.labels(*labels).set_function(functools.partial(self._as_read, "kv_cache_usage"))
        ENGINE_LOAD_READABLE.labels(*labels).set_function(lambda: self.readable)
        ENGINE_YIELDING.labels(*labels).set_function(lambda: self.yielding)

    def _as_read(self, name: str) -> float:
        value = None if self.reading is None else getattr(self.reading, name)
        return math.nan if value is None else float(value)

    def room(self) -> int:
        """The calls this process may have in flight on the replica now (``room`` above)."""
        limit = self._own_limit()
        if not self.yields:
            return limit
        return room(limit, self.reading, self.full, time.monotonic() - self._others_seen < LINGER_SECONDS)

    @property
    def yielding(self) -> bool:
        return self.room() < self._own_limit()

    async def in_use(self) -> None:
        """The replica is about to be used: reading starts if it had stopped, and returns once it was read."""
        self._used = time.monotonic()
        if self._task is None or self._task.done():
            self._first_read = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._read_while_used(self._first_read))
        assert self._first_read is not None
        await asyncio.shield(self._first_read)

    async def _read_while_used(self, first: asyncio.Future[None]) -> None:
        try:
            while self._ours() > 0 or time.monotonic() - self._used < _IDLE_SECONDS:
                await self.read()
                if not first.done():
                    first.set_result(None)
                await asyncio.sleep(READ_SECONDS)
        finally:
            self.reading = None  # nobody looks: it would be stale when somebody does
            if not first.done():
                first.set_result(None)

    async def read(self) -> None:
        before = self._ours()
        try:
            running, waiting, kv = await self.reader.read()
        except Exception as exc:  # noqa: BLE001 - whatever the endpoint does, the batch runs on without it
            self.reading, self.readable = None, False
            if not self._warned:
                log.warning("engine of %s at %s: its load metrics at %s cannot be read (%s); its batches run as "
                            "without load_metrics until they can", self.model, self.replica, self.reader.url, exc)
                self._warned = True
        else:
            if not self.readable:
                log.info("engine of %s at %s: its load metrics read again", self.model, self.replica)
            self.readable = True
            self.reading = Reading(running, waiting, max(before, self._ours()), kv)
            if self.reading.others > 0:
                self._others_seen = time.monotonic()
            if waiting > 0 and running > 0:
                self.full = running
        self._on_read()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.reader.aclose()
