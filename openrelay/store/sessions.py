"""Dashboard sessions: a random id in the browser's cookie, only its SHA-256 here, with the key it acts as."""

from __future__ import annotations

import hashlib
import secrets

import sqlalchemy as sa

from ..clock import now
from .db import Database, holds_nul
from .schema import web_sessions

__all__ = ["Sessions", "hash_session_id"]


def hash_session_id(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, db: Database) -> None:
        self.db = db

    def open(self, *, key_id: str, org_id: str, lifetime_seconds: int) -> str:
        """A new session; the id is returned once (for the cookie) and only its hash is kept. Sessions past
        their end are swept here, so the table holds live ones and a few stale ones at most."""
        session_id = secrets.token_urlsafe(32)
        stamp = now()
        with self.db.write() as conn:
            conn.execute(web_sessions.delete().where(web_sessions.c.expires_at <= stamp))
            conn.execute(web_sessions.insert().values(id_hash=hash_session_id(session_id), key_id=key_id,
                                                      org_id=org_id, created_at=stamp,
                                                      expires_at=stamp + lifetime_seconds))
        return session_id

    def key_id(self, session_id: str) -> str | None:
        """The key of a live session, or None for an unknown, ended or expired one."""
        if not session_id or holds_nul(session_id):
            return None
        with self.db.read() as conn:
            row = conn.execute(sa.select(web_sessions.c.key_id).where(
                web_sessions.c.id_hash == hash_session_id(session_id),
                web_sessions.c.expires_at > now())).first()
        return None if row is None else row.key_id

    def close(self, session_id: str) -> None:
        if not session_id or holds_nul(session_id):
            return
        with self.db.write() as conn:
            conn.execute(web_sessions.delete().where(web_sessions.c.id_hash == hash_session_id(session_id)))
