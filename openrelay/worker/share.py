"""Workers that spread by themselves: a worker's heartbeat in the store, and its share of each model's slots,
``ceil(slots / live workers serving it)`` (docs/deploy.md). The slots themselves are counted over every worker
under the model's lock (``store/leases.py``)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Collection
from importlib import metadata

from ..store.workers import WorkerRegistry

__all__ = ["Heartbeat", "slot_share"]

log = logging.getLogger("openrelay.worker")

_BEATS_PER_LEASE = 3  # a worker whose beats stall for a third of its lease is still alive at the next


def slot_share(slots: int, live_workers: int) -> int:
    """The most batches of a model with ``slots`` one worker of ``live_workers`` runs: its share, rounded up."""
    return -(-slots // max(1, live_workers))


def _version() -> str:
    try:
        return metadata.version("openrelay")
    except metadata.PackageNotFoundError:
        return "unknown"


class Heartbeat:
    """A worker's row in the store, renewed at most every ``lease_seconds / 3``; ``live`` is what its last beat
    read back: per model it serves, the live workers serving it (this worker included)."""

    def __init__(self, registry: WorkerRegistry, worker_id: str, models: Collection[str],
                 lease_seconds: float) -> None:
        self.registry = registry
        self.worker_id = worker_id
        self.models = sorted(models)
        self.lease_seconds = lease_seconds
        self.live: dict[str, int] = {}
        self._host = os.uname().nodename
        self._pid = os.getpid()
        self._version = _version()
        self._beat_at = -float("inf")

    async def beat(self, *, force: bool = False) -> None:
        clock = time.monotonic()
        if not force and clock < self._beat_at + self.lease_seconds / _BEATS_PER_LEASE:
            return
        self._beat_at = clock
        counted = await asyncio.to_thread(self.registry.heartbeat, self.worker_id, host=self._host, pid=self._pid,
                                          version=self._version, models=self.models, lease_seconds=self.lease_seconds)
        live = {model: counted.get(model, 1) for model in self.models}
        if live != self.live:
            log.info("worker %s: live workers serving %s", self.worker_id,
                     ", ".join(f"{model} {n}" for model, n in live.items()) or "(no models)")
        self.live = live

    def share(self, model: str, slots: int) -> int:
        """This worker's share of ``model``'s ``slots`` as its last beat counted the workers serving it."""
        return slot_share(slots, self.live.get(model, 1))

    async def leave(self) -> None:
        await asyncio.to_thread(self.registry.leave, self.worker_id)
