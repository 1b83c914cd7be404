"""Keeping a running batch's lease: renew it, and notice a cancel or the lease passing to another worker."""

from __future__ import annotations

import asyncio
import logging
import time

from ..config import WorkerSettings
from ..store.leases import BatchLeases
from ..types import BatchStatus

__all__ = ["LeaseKeeper"]

log = logging.getLogger("openrelay.worker")


class LeaseKeeper:
    """``run`` reads the batch every tick (to see a cancel) and renews the lease every third of its length. A store
    error is tried again next tick; once the lease may have lapsed unrenewed, the run counts it as lost."""

    def __init__(self, leases: BatchLeases, settings: WorkerSettings, batch_id: str, worker_id: str) -> None:
        self.leases = leases
        self.settings = settings
        self.batch_id = batch_id
        self.worker_id = worker_id
        self.cancelled = False  # the batch is cancelling: take no more records
        self.lost = False  # another worker may hold the batch now: write nothing more, finalize nothing

    async def run(self) -> None:
        settings = self.settings
        renewed = time.monotonic()
        while not self.lost:
            await asyncio.sleep(settings.tick_seconds)
            try:
                if time.monotonic() - renewed >= settings.lease_seconds / 3:
                    current = await asyncio.to_thread(self.leases.renew_lease, self.batch_id, self.worker_id,
                                                      settings.lease_seconds)
                    renewed = time.monotonic()
                else:
                    current = await asyncio.to_thread(self.leases.by_id, self.batch_id)
                    current = current if current.lease_owner == self.worker_id else None
            except Exception as exc:
                log.warning("batch %s: heartbeat failed (%s: %s)", self.batch_id, exc.__class__.__name__, exc)
                if time.monotonic() - renewed < settings.lease_seconds:
                    continue
                current = None
            if current is None:
                self.lost = True
            else:
                cancelled = current.status is BatchStatus.CANCELLING
                if cancelled and not self.cancelled:
                    log.info("batch %s: cancelling; this worker starts no more of its records", self.batch_id)
                self.cancelled = cancelled
