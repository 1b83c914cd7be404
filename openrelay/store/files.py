"""File rows. The bytes live in the blob store under ``blob_key``; this table says who owns them."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from ..blobs.keys import rejections_key
from ..clock import now, now_ns
from ..errors import no_such
from ..types import TERMINAL_VALUES, Batch, FileRecord
from .db import Database, holds_nul, in_order_after
from .schema import batches, files

__all__ = ["Files", "FileUses", "insert_file", "unexpired"]


@dataclass(frozen=True, kw_only=True)
class FileUses:
    """The batches created from one file (its ``input_file_id``)."""

    batch_ids: tuple[str, ...]  # the newest first, at most the number asked for
    count: int  # all of them


def _file(row: Row) -> FileRecord:
    return FileRecord(id=row.id, org_id=row.org_id, purpose=row.purpose, filename=row.filename,
                      bytes=row.bytes, created_at=row.created_at, blob_key=row.blob_key, expires_at=row.expires_at)


def unexpired() -> sa.ColumnElement[bool]:
    """A file past its ``expires_at`` is gone on every route at once, whether or not the sweeper deleted it yet."""
    return sa.or_(files.c.expires_at.is_(None), files.c.expires_at > now())


def insert_file(conn: Connection, *, file_id: str, org_id: str, purpose: str, filename: str, size: int,
                blob_key: str, expires_after: int | None = None, created_at: int | None = None) -> None:
    """A file row; ``expires_after`` seconds: it expires that long after its ``created_at``."""
    created_at = now() if created_at is None else created_at
    expires_at = None if expires_after is None else created_at + expires_after
    conn.execute(files.insert(), {  # the values as parameters: the statement is compiled once, not per file
        "id": file_id, "org_id": org_id, "purpose": purpose, "filename": filename, "bytes": size,
        "created_at": created_at, "created_ns": now_ns(), "blob_key": blob_key, "expires_at": expires_at})


class Files:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, *, file_id: str, org_id: str, purpose: str, filename: str, size: int,
            blob_key: str, expires_after: int | None = None) -> FileRecord:
        with self.db.write() as conn:
            insert_file(conn, file_id=file_id, org_id=org_id, purpose=purpose, filename=filename, size=size,
                        blob_key=blob_key, expires_after=expires_after)
        return self.get(org_id, file_id)

    def get(self, org_id: str, file_id: str) -> FileRecord:
        """The file, or 404 alike for an unknown id and another organization's."""
        row = None
        if not holds_nul(file_id):
            with self.db.read() as conn:
                row = conn.execute(sa.select(files).where(files.c.id == file_id, files.c.org_id == org_id,
                                                          unexpired())).first()
        if row is None:
            raise no_such("File", file_id, param="file_id")
        return _file(row)

    def list(self, org_id: str, *, limit: int, after: str | None, purpose: str | None, oldest_first: bool = False,
             ) -> tuple[list[FileRecord], bool]:
        query = sa.select(files).where(files.c.org_id == org_id, unexpired())
        if holds_nul(purpose):
            query = query.where(sa.false())  # no purpose holds NUL (and PostgreSQL cannot be asked about one)
        elif purpose:
            query = query.where(files.c.purpose == purpose)
        with self.db.read() as conn:
            query = in_order_after(conn, files, query, org_id=org_id, after=after, kind="File",
                                   oldest_first=oldest_first)
            rows = conn.execute(query.limit(limit + 1)).all()
        return [_file(r) for r in rows[:limit]], len(rows) > limit

    def batches_reading(self, org_id: str, file_ids: builtins.list[str], *, newest: int) -> dict[str, FileUses]:
        """The batches each of ``file_ids`` is the input of (files no batch used are left out): one query for
        all of them, on the index ``ix_batches_org_input_file`` (migration 0013), with the ``newest`` of each."""
        if not file_ids:
            return {}
        order = (batches.c.created_ns.desc(), batches.c.id.desc())
        ranked = sa.select(
            batches.c.input_file_id, batches.c.id,
            sa.func.row_number().over(partition_by=batches.c.input_file_id, order_by=order).label("rank"),
            sa.func.count().over(partition_by=batches.c.input_file_id).label("uses"),
        ).where(batches.c.org_id == org_id, batches.c.input_file_id.in_(file_ids)).subquery()
        query = sa.select(ranked).where(ranked.c.rank <= newest).order_by(ranked.c.input_file_id, ranked.c.rank)
        found: dict[str, list[str]] = {}
        counts: dict[str, int] = {}
        with self.db.read() as conn:
            for row in conn.execute(query):
                found.setdefault(row.input_file_id, []).append(row.id)
                counts[row.input_file_id] = row.uses
        return {file_id: FileUses(batch_ids=tuple(ids), count=counts[file_id]) for file_id, ids in found.items()}

    def delete(self, org_id: str, file_id: str) -> tuple[FileRecord, bool]:
        """Remove the row; returns the file and whether its blob may go too (no unfinished batch reads it)."""
        record = self.get(org_id, file_id)
        with self.db.write() as conn:
            conn.execute(files.delete().where(files.c.id == file_id, files.c.org_id == org_id))
            in_use = conn.execute(sa.select(batches.c.id).where(
                sa.or_(batches.c.input_blob_key == record.blob_key, batches.c.rejections_file_id == file_id),
                batches.c.status.not_in(TERMINAL_VALUES),
            ).limit(1)).first()
        return record, in_use is None

    def orphaned_batch_blobs(self, batch: Batch) -> builtins.list[str]:
        """Blobs an ended batch kept alive that no file row names any more (deleted while it ran)."""
        keys = [batch.input_blob_key] + ([rejections_key(batch.id)] if batch.rejected_count else [])
        with self.db.read() as conn:
            named = set(conn.execute(_NAMED, {"keys": keys}).scalars())
            busy = set(conn.execute(_READ_BY_OTHERS, {"key": batch.input_blob_key, "batch_id": batch.id}).scalars())
        return [k for k in keys if k not in named and k not in busy]


# ``orphaned_batch_blobs``'s reads, built once: every batch's end runs them.
_NAMED = sa.select(files.c.blob_key).where(files.c.blob_key.in_(sa.bindparam("keys", expanding=True)))
_READ_BY_OTHERS = sa.select(batches.c.input_blob_key).where(
    batches.c.input_blob_key == sa.bindparam("key"), batches.c.id != sa.bindparam("batch_id"),
    batches.c.status.not_in(TERMINAL_VALUES))
