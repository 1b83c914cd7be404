"""Idempotency keys of creates (docs/api-contract.md §5): a create claims its key (an INSERT only one concurrent
create can win), its batch and stored 200 commit together, and a create that fails gives the key back. A claim
left by a dead server is taken over after ``claim_seconds``, fenced by its ``claim_token``; rows live
``keep_seconds``. Why a key never yields two batches: docs/design.md, "Idempotency keys"."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..clock import seconds
from ..errors import Conflict, UnprocessableEntity
from ..ids import new_claim_token
from .db import Database
from .schema import idempotency_keys

__all__ = ["IdempotencyKeys", "Claim", "Stored", "complete_claim"]


@dataclass(frozen=True, kw_only=True)
class Claim:
    """This create holds the key; it must complete or release it."""

    org_id: str
    key: str
    token: str
    keep_seconds: float


@dataclass(frozen=True, kw_only=True)
class Stored:
    """The key already has its 200: these are the exact bytes to answer again."""

    answer: bytes


class IdempotencyKeys:
    def __init__(self, db: Database, *, keep_seconds: float, claim_seconds: float) -> None:
        self.db = db
        self.keep_seconds = keep_seconds
        self.claim_seconds = claim_seconds

    def claim(self, org_id: str, key: str, request_sha256: str) -> Claim | Stored:
        """Claim ``key`` for a create whose body hashes to ``request_sha256``, or say why not.

        Raises 422 ``idempotency_key_reused`` when the key belongs to another body (stored or still running),
        409 ``idempotency_key_in_use`` while the same body's first create is still running.
        """
        clock = seconds()
        token = new_claim_token()
        values = {"org_id": org_id, "idempotency_key": key, "request_sha256": request_sha256,
                  "claim_token": token, "claimed_at": clock, "expires_at": clock + self.keep_seconds,
                  "answer": None}
        mine = Claim(org_id=org_id, key=key, token=token, keep_seconds=self.keep_seconds)
        this_key = (idempotency_keys.c.org_id == org_id, idempotency_keys.c.idempotency_key == key)
        with self.db.write() as conn:
            conn.execute(idempotency_keys.delete().where(idempotency_keys.c.expires_at <= clock))
            while True:
                if conn.execute(self._insert_unless_taken(values)).first() is not None:
                    return mine
                # Taken. On PostgreSQL the INSERT waited for a concurrent claimer to commit; lock the row so a
                # takeover below cannot race another one (SQLite's BEGIN IMMEDIATE already serialises writers).
                # The row may be gone again by now, released by a create that failed: then insert afresh.
                row = conn.execute(sa.select(idempotency_keys).where(*this_key).with_for_update()).first()
                if row is not None:
                    break
            stale = row.answer is None and row.claimed_at <= clock - self.claim_seconds
            if stale:
                conn.execute(idempotency_keys.update().where(*this_key).values(**values))
                return mine
            if row.request_sha256 != request_sha256:
                raise UnprocessableEntity(
                    "this Idempotency-Key was already used with a different request body; send the "
                    "byte-identical body of the first request, or a new key", code="idempotency_key_reused")
            if row.answer is None:
                raise Conflict("a create with this Idempotency-Key is still running; retry when it has answered",
                               code="idempotency_key_in_use")
            return Stored(answer=row.answer.encode())

    def release(self, claim: Claim) -> None:
        """The create failed: free the key so a retry can run (a no-op when the claim was taken over)."""
        with self.db.write() as conn:
            conn.execute(idempotency_keys.delete().where(*_held(claim)))

    def _insert_unless_taken(self, values: dict[str, object]) -> sa.Insert:
        """INSERT that does nothing on a taken key; it returns a row only when it inserted one."""
        dialect = sqlite if self.db.is_sqlite else postgresql
        return (dialect.insert(idempotency_keys).values(**values).on_conflict_do_nothing()
                .returning(idempotency_keys.c.claim_token))


def complete_claim(conn: Connection, claim: Claim, answer: bytes) -> None:
    """Store the 200 in the create's own transaction; 409 (rolling the create back) when the claim was lost."""
    done = conn.execute(idempotency_keys.update().where(*_held(claim)).values(
        answer=answer.decode(), expires_at=seconds() + claim.keep_seconds))
    if done.rowcount != 1:
        raise Conflict("another create took over this Idempotency-Key while this one ran; retry to get its answer",
                       code="idempotency_key_in_use")


def _held(claim: Claim) -> tuple[sa.ColumnElement[bool], ...]:
    return (idempotency_keys.c.org_id == claim.org_id, idempotency_keys.c.idempotency_key == claim.key,
            idempotency_keys.c.claim_token == claim.token, idempotency_keys.c.answer.is_(None))
