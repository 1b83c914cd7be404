"""What the sweeper deletes (``worker/sweeper.py``): expired files, batches past the operator's retention with
their files, and bookkeeping rows past their time; and the sweeper's lease. Rows go in one transaction per kind,
their blobs queued in ``blob_deletions`` in that same transaction for the sweeper to delete after; so a process
killed in between leaves bytes queued, never orphaned. Each kind is bounded by ``limit`` rows per call; a dry run
counts them all and changes nothing. Times are the database's clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..blobs.keys import batch_folder
from ..types import DAY_SECONDS, TERMINAL_VALUES
from .db import Database
from .ended_counts import count_ended
from .schema import (
    batch_chunks,
    batch_tags,
    batches,
    blob_deletions,
    files,
    idempotency_keys,
    sweeps,
    web_sessions,
    webhook_attempts,
    webhook_deliveries,
    webhook_endpoints,
    webhook_events,
)
from .webhook_outbox import PENDING

__all__ = ["Retention", "QueuedBlob", "Pruned", "DAY_SECONDS"]

_SWEEP = "sweeper"  # the one row of ``sweeps``
_DELETED = (batches.c.id, batches.c.org_id, batches.c.output_file_id, batches.c.error_file_id,
            batches.c.rejections_file_id, batches.c.input_file_id)  # what deleting a batch reads of its row
_ENDED = sa.func.coalesce(batches.c.completed_at, batches.c.failed_at, batches.c.expired_at, batches.c.cancelled_at)


@dataclass(frozen=True)
class QueuedBlob:
    key: str
    folder: bool  # everything under the key (a batch's folder)


@dataclass(frozen=True)
class Pruned:
    """What one call removed (or, in a dry run, would remove): ``rows`` of its kind, the ``files`` that went with
    them (a batch's own) and the ``bytes`` of all those files, and whether it stopped at its limit (more is left)."""
    rows: int = 0
    bytes: int = 0
    more: bool = False
    files: int = 0


class Retention:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- the lease: one pass at a time across the fleet ---------------------------------------------------------

    def take_pass(self, owner: str, lease_seconds: float) -> bool:
        """Take the sweeper's lease if no pass runs (or its runner's lease lapsed) and the next is due."""
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            conn.execute(self._insert_new(sweeps, {"name": _SWEEP, "next_pass_at": 0.0}))
            taken = conn.execute(sweeps.update().where(
                sweeps.c.name == _SWEEP, sweeps.c.next_pass_at <= clock,
                sa.or_(sweeps.c.owner.is_(None), sweeps.c.lease_expires_at < clock),
            ).values(owner=owner, lease_expires_at=clock + lease_seconds))
            return taken.rowcount == 1

    def end_pass(self, owner: str, next_in: float) -> None:
        """Give the lease back; the next pass (any worker's) is due ``next_in`` seconds from now."""
        with self.db.write() as conn:
            conn.execute(sweeps.update().where(sweeps.c.name == _SWEEP, sweeps.c.owner == owner).values(
                owner=None, lease_expires_at=None, next_pass_at=self.db.clock(conn) + next_in))

    # -- blobs whose rows are gone ------------------------------------------------------------------------------

    def queued_blobs(self, limit: int) -> list[QueuedBlob]:
        with self.db.read() as conn:
            rows = conn.execute(sa.select(blob_deletions.c.blob_key, blob_deletions.c.folder)
                                .order_by(blob_deletions.c.queued_at).limit(limit)).all()
        return [QueuedBlob(key=r.blob_key, folder=bool(r.folder)) for r in rows]

    def forget_blobs(self, keys: Sequence[str]) -> None:
        """These blobs are deleted: out of the queue."""
        with self.db.write() as conn:
            conn.execute(blob_deletions.delete().where(blob_deletions.c.blob_key.in_(keys)))

    def _queue(self, conn: Connection, keys: Sequence[str], *, folder: bool = False) -> None:
        clock = int(self.db.clock(conn))
        for key in keys:
            conn.execute(self._insert_new(blob_deletions, {"blob_key": key, "folder": folder, "queued_at": clock}))

    def _insert_new(self, table: sa.Table, values: dict[str, object]) -> sa.Insert:
        dialect = sqlite if self.db.is_sqlite else postgresql
        return dialect.insert(table).values(**values).on_conflict_do_nothing()

    # -- files --------------------------------------------------------------------------------------------------

    def expired_files(self, *, limit: int, dry_run: bool = False) -> Pruned:
        """Files past their ``expires_at``. A blob an unfinished batch still reads (an expired input) stays, as
        when the file is deleted: the batch's end deletes it (``Files.orphaned_batch_blobs``)."""
        return self._files(lambda clock: files.c.expires_at <= int(clock), limit=limit, dry_run=dry_run)

    def unused_files(self, *, older_than_days: float, limit: int, dry_run: bool = False) -> Pruned:
        """Files made more than ``older_than_days`` ago that no batch kept (``_kept_batches``) names."""
        def condition(clock: float) -> sa.ColumnElement[bool]:
            kept = _kept_batches(clock - older_than_days * DAY_SECONDS)
            named = sa.union(*(sa.select(column).where(kept, column.is_not(None)) for column in (
                batches.c.input_file_id, batches.c.output_file_id, batches.c.error_file_id,
                batches.c.rejections_file_id)))
            return sa.and_(files.c.created_at < clock - older_than_days * DAY_SECONDS, files.c.id.not_in(named),
                           sa.or_(files.c.expires_at.is_(None), files.c.expires_at > int(clock)))  # not counted twice
        return self._files(condition, limit=limit, dry_run=dry_run)

    def _files(self, condition: Callable[[float], sa.ColumnElement[bool]], *, limit: int, dry_run: bool) -> Pruned:
        """The files ``condition`` (given the database's clock) picks: rows deleted, blobs no unfinished batch
        reads queued."""
        with self.db.write() as conn:
            where = condition(self.db.clock(conn))
            if dry_run:
                count, size = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(files.c.bytes), 0))
                                           .where(where)).one()
                return Pruned(rows=count, bytes=int(size))
            rows = conn.execute(sa.select(files.c.id, files.c.blob_key, files.c.bytes).where(where)
                                .limit(limit)).all()
            if not rows:
                return Pruned()
            ids = [r.id for r in rows]
            conn.execute(files.delete().where(files.c.id.in_(ids)))
            unfinished = batches.c.status.not_in(TERMINAL_VALUES)
            read = set(conn.execute(sa.select(batches.c.input_blob_key).where(
                unfinished, batches.c.input_blob_key.in_([r.blob_key for r in rows]))).scalars())
            read |= set(conn.execute(sa.select(batches.c.rejections_file_id).where(
                unfinished, batches.c.rejections_file_id.in_(ids))).scalars())
            self._queue(conn, [r.blob_key for r in rows if r.blob_key not in read and r.id not in read])
            return Pruned(rows=len(rows), bytes=sum(r.bytes for r in rows), more=len(rows) == limit)

    # -- batches past the operator's retention ------------------------------------------------------------------

    def ended_batches(self, *, older_than_days: float, limit: int, dry_run: bool = False) -> Pruned:
        """Batches that ended more than ``older_than_days`` ago, but those a webhook delivery still owes
        (``_kept_batches``): their rows (tags, chunks, webhook events and their deliveries), their result and
        rejections files, and every blob under their folder. Their input files go with ``unused_files`` (which, in
        a dry run, counts these batches' own files too)."""
        with self.db.write() as conn:
            gone = sa.not_(_kept_batches(self.db.clock(conn) - older_than_days * DAY_SECONDS))
            if dry_run:
                return Pruned(rows=conn.execute(sa.select(sa.func.count()).where(gone)).scalar_one())
            rows = conn.execute(sa.select(*_DELETED).where(gone).limit(limit)
                                .with_for_update()).all()  # PostgreSQL: no metadata edit moves their tags now
            if not rows:
                return Pruned()
            return self._delete_batches(conn, rows, limit=limit)

    def delete_ended_batch(self, org_id: str, batch_id: str) -> bool:
        """One ended batch of the organization, as ``ended_batches`` deletes them (its input file too, when the
        create stored it from inline requests); False when it has none such that ended."""
        with self.db.write() as conn:
            rows = conn.execute(sa.select(*_DELETED).where(
                batches.c.id == batch_id, batches.c.org_id == org_id, batches.c.status.in_(TERMINAL_VALUES))
                .with_for_update()).all()
            if not rows:
                return False
            inline = sa.select(files.c.id).where(files.c.id == rows[0].input_file_id,
                                                 files.c.filename == f"{batch_id}_requests.jsonl")
            self._delete_batches(conn, rows, extra_files=list(conn.execute(inline).scalars()))
            return True

    def _delete_batches(self, conn: Connection, rows: Sequence[sa.Row], *, limit: int = 0,
                        extra_files: Sequence[str] = ()) -> Pruned:
        ids = [r.id for r in rows]
        file_ids = [f for r in rows for f in (r.output_file_id, r.error_file_id, r.rejections_file_id) if f]
        file_ids += extra_files
        found = conn.execute(sa.select(files.c.blob_key, files.c.bytes).where(files.c.id.in_(file_ids))).all()
        conn.execute(files.delete().where(files.c.id.in_(file_ids)))
        _delete_events(conn, sa.select(webhook_events.c.id).where(webhook_events.c.batch_id.in_(ids)))
        count_ended(conn, ids, sign=-1)  # off the summary's counters, in the transaction that deletes them
        conn.execute(batch_tags.delete().where(batch_tags.c.batch_id.in_(ids)))
        conn.execute(batch_chunks.delete().where(batch_chunks.c.batch_id.in_(ids)))
        conn.execute(batches.delete().where(batches.c.id.in_(ids)))
        self._queue(conn, [r.blob_key for r in found])
        self._queue(conn, [batch_folder(batch_id) for batch_id in ids], folder=True)
        return Pruned(rows=len(ids), files=len(found), bytes=sum(r.bytes for r in found), more=len(ids) == limit)

    # -- bookkeeping, whatever the retention ------------------------------------------------------------------

    def bookkeeping(self, *, older_than_days: float, limit: int, dry_run: bool = False) -> dict[str, Pruned]:
        """Expired dashboard sessions and Idempotency-Keys; webhook endpoints removed more than
        ``older_than_days`` ago that no delivery or attempt names; the chunk rows and throughput window of batches
        that ended that long ago. The webhook delivery log has its own age (``WebhookLog.prune_delivery_log``)."""
        found: dict[str, Pruned] = {}
        with self.db.write() as conn:
            clock = self.db.clock(conn)
            cutoff = clock - older_than_days * DAY_SECONDS
            referenced = sa.union(sa.select(webhook_deliveries.c.endpoint_id),
                                  sa.select(webhook_attempts.c.endpoint_id))
            old_ended = sa.select(batches.c.id).where(batches.c.status.in_(TERMINAL_VALUES), _ENDED < cutoff)
            kinds: dict[str, tuple[sa.ColumnElement, sa.ColumnElement[bool]]] = {
                "web_sessions": (web_sessions.c.id_hash, web_sessions.c.expires_at <= int(clock)),
                "idempotency_keys": (idempotency_keys.c.expires_at, idempotency_keys.c.expires_at <= clock),
                "webhook_endpoints": (webhook_endpoints.c.id, sa.and_(webhook_endpoints.c.removed_at < cutoff,
                                                                       webhook_endpoints.c.id.not_in(referenced))),
                "batch_chunks": (batch_chunks.c.batch_id, batch_chunks.c.batch_id.in_(old_ended)),
                "throughput_windows": (batches.c.id, sa.and_(batches.c.throughput_window.is_not(None),
                                                             batches.c.id.in_(old_ended))),
            }
            for name, (key, where) in kinds.items():
                if dry_run:
                    found[name] = Pruned(rows=conn.execute(sa.select(sa.func.count()).where(where)).scalar_one())
                    continue
                chosen = sa.select(key).where(where).limit(limit)
                if name == "throughput_windows":
                    count = conn.execute(batches.update().where(batches.c.id.in_(chosen))
                                         .values(throughput_window=None)).rowcount
                else:  # every row whose key is among those chosen (for keys that are no primary key: a few more)
                    count = conn.execute(key.table.delete().where(key.in_(chosen))).rowcount
                found[name] = Pruned(rows=count, more=count >= limit)
        return found


def _kept_batches(cutoff: float) -> sa.ColumnElement[bool]:
    """Batches the retention keeps: not ended, ended at or after ``cutoff``, or whose event a webhook delivery
    still owes (kept with its files until it is delivered or given up, so that the receiver finds the batch)."""
    owed = sa.exists().where(webhook_events.c.batch_id == batches.c.id,
                             webhook_deliveries.c.event_id == webhook_events.c.id,
                             webhook_deliveries.c.state == PENDING)
    return sa.or_(batches.c.status.not_in(TERMINAL_VALUES), _ENDED.is_(None), _ENDED >= cutoff, owed)


def _delete_events(conn: Connection, events: sa.Select) -> None:
    """Webhook events and their delivery log (deliveries, attempts)."""
    ids = list(conn.execute(events).scalars())
    if not ids:
        return
    for table, column in ((webhook_attempts, "event_id"), (webhook_deliveries, "event_id"), (webhook_events, "id")):
        conn.execute(table.delete().where(table.c[column].in_(ids)))
