"""The sweeper: deletes what is past its time, files' bytes included. Every worker runs one; a lease in the store
(``Retention.take_pass``) lets one pass run at a time across the fleet; ``orl admin prune`` runs passes on demand
(``prune``). The rules: docs/design.md, "Expiry and retention"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from dataclasses import dataclass, field

from ..blobs.base import BlobStore
from ..config import RetentionSettings
from ..store.retention import Pruned, Retention

__all__ = ["Sweeper", "Sweep", "sweep_once", "prune"]

log = logging.getLogger("openrelay.sweeper")

LEASE_SECONDS = 300.0  # a pass's lease; a sweeper that dies mid-pass is taken over this long after


@dataclass
class Sweep:
    """What passes removed (or, dry, would remove), by kind; ``more``: one stopped at its bound."""
    removed: dict[str, Pruned] = field(default_factory=dict)
    blobs: int = 0  # blobs (or batch folders) deleted from the blob store
    more: bool = False

    def add(self, name: str, pruned: Pruned) -> None:
        """Count ``pruned`` under ``name``; a batch's own files count under ``files``, with the unused ones."""
        before = self.removed.get(name, Pruned())
        self.removed[name] = Pruned(rows=before.rows + pruned.rows, bytes=before.bytes + pruned.bytes)
        if pruned.files:
            self.add("files", Pruned(rows=pruned.files))
        self.more = self.more or pruned.more

    def as_json(self) -> dict[str, int]:
        shown = {name: pruned.rows for name, pruned in self.removed.items()}
        shown["file_bytes"] = sum(p.bytes for p in self.removed.values())
        shown["blobs"] = self.blobs
        return shown


def sweep_once(retention: Retention, blobs: BlobStore, settings: RetentionSettings, *,
               dry_run: bool = False) -> Sweep:
    """One bounded pass: expired files; with ``retention_days``, ended batches and the files no kept batch names;
    the bookkeeping rows; then the bytes of everything deleted (now and by any pass a crash interrupted)."""
    sweep = Sweep()
    limit = settings.sweep_limit
    sweep.add("expired_files", retention.expired_files(limit=limit, dry_run=dry_run))
    if settings.retention_days is not None:
        days = settings.retention_days
        sweep.add("batches", retention.ended_batches(older_than_days=days, limit=limit, dry_run=dry_run))
        sweep.add("files", retention.unused_files(older_than_days=days, limit=limit, dry_run=dry_run))
    for name, pruned in retention.bookkeeping(older_than_days=settings.bookkeeping_days, limit=limit,
                                              dry_run=dry_run).items():
        sweep.add(name, pruned)
    if not dry_run:
        delete_queued_blobs(retention, blobs, limit, sweep)
    return sweep


def delete_queued_blobs(retention: Retention, blobs: BlobStore, limit: int, sweep: Sweep) -> None:
    """Delete the queued blobs (at most ``limit``); each leaves the queue once it is gone from the blob store."""
    queued = retention.queued_blobs(limit)
    for blob in queued:
        if blob.folder:
            blobs.delete_folder(blob.key)
        else:
            blobs.delete(blob.key)
    if queued:
        retention.forget_blobs([blob.key for blob in queued])
    sweep.blobs += len(queued)
    sweep.more = sweep.more or len(queued) == limit


def prune(retention: Retention, blobs: BlobStore, settings: RetentionSettings, *, dry_run: bool = False) -> Sweep:
    """Everything there is to remove now, in as many passes as it takes (``orl admin prune``)."""
    if dry_run:
        return sweep_once(retention, blobs, settings, dry_run=True)
    total = Sweep()
    while True:
        sweep = sweep_once(retention, blobs, settings)
        for name, pruned in sweep.removed.items():
            total.add(name, pruned)
        total.blobs += sweep.blobs
        if not sweep.more:
            return total


class Sweeper:
    """A worker's sweeper loop (``server.py`` runs it beside the worker)."""

    def __init__(self, retention: Retention, blobs: BlobStore, settings: RetentionSettings) -> None:
        self.retention = retention
        self.blobs = blobs
        self.settings = settings
        self.owner = f"{os.uname().nodename}-{os.getpid()}-sweeper-{secrets.token_hex(3)}"

    def pass_if_due(self) -> Sweep | None:
        """One pass, if this sweeper takes the lease; the next is due at once when this one stopped at a bound."""
        if not self.retention.take_pass(self.owner, LEASE_SECONDS):
            return None
        sweep = Sweep(more=True)
        try:
            sweep = sweep_once(self.retention, self.blobs, self.settings)
        finally:
            self.retention.end_pass(self.owner, 0.0 if sweep.more else self.settings.sweep_seconds)
        if any(p.rows for p in sweep.removed.values()) or sweep.blobs:
            log.info("sweeper: removed %s", sweep.as_json())
        return sweep

    async def run_forever(self, stop: asyncio.Event) -> None:
        """A pass whenever one is due, until ``stop`` is set; looks every ``sweep_seconds`` (at most 5 s)."""
        while not stop.is_set():
            try:
                sweep = await asyncio.to_thread(self.pass_if_due)
                if sweep is not None and sweep.more:
                    continue  # it stopped at its bound: the next pass at once
            except Exception:  # the store or the blob store is away: a later pass tries again
                log.exception("sweeper pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(self.settings.sweep_seconds, 5.0))
