"""Organizations and API keys. Keys are stored as sha256 hashes and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

import sqlalchemy as sa
from sqlalchemy.engine import Row

from ..clock import now
from ..errors import Conflict, NotFound
from ..ids import new_api_key, new_key_id, new_org_id
from ..types import ALL_SCOPES, ApiKey, Organization
from .db import Database
from .schema import api_keys, organizations

__all__ = ["Accounts", "hash_key"]


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _org(row: Row) -> Organization:
    return Organization(id=row.id, name=row.name, expedited_enabled=bool(row.expedited_enabled),
                        created_at=row.created_at)


def _key(row: Row) -> ApiKey:
    return ApiKey(id=row.id, org_id=row.org_id, prefix=row.prefix, scopes=frozenset(row.scopes.split(",")),
                  budget_nano_usd=row.budget_nano_usd, spent_nano_usd=row.spent_nano_usd,
                  created_at=row.created_at, revoked_at=row.revoked_at, hard_budget=bool(row.hard_budget),
                  reserved_nano_usd=row.reserved_nano_usd)


class Accounts:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create_org(self, name: str) -> Organization:
        with self.db.write() as conn:
            if conn.execute(sa.select(organizations.c.id).where(organizations.c.name == name)).first():
                raise Conflict(f"organization {name!r} already exists", code="org_exists")
            org_id = new_org_id()
            conn.execute(organizations.insert().values(id=org_id, name=name, expedited_enabled=True,
                                                       created_at=now()))
        return self.org_by_name(name)

    def org_by_name(self, name: str) -> Organization:
        with self.db.read() as conn:
            row = conn.execute(sa.select(organizations).where(organizations.c.name == name)).first()
        if row is None:
            raise NotFound(f"no organization named {name!r}")
        return _org(row)

    def org(self, org_id: str) -> Organization:
        with self.db.read() as conn:
            row = conn.execute(sa.select(organizations).where(organizations.c.id == org_id)).first()
        if row is None:
            raise NotFound(f"no organization {org_id!r}")
        return _org(row)

    def list_orgs(self) -> list[Organization]:
        with self.db.read() as conn:
            rows = conn.execute(sa.select(organizations).order_by(organizations.c.created_at)).all()
        return [_org(r) for r in rows]

    def set_expedited(self, name: str, enabled: bool) -> Organization:
        with self.db.write() as conn:
            done = conn.execute(organizations.update().where(organizations.c.name == name)
                                .values(expedited_enabled=enabled))
        if done.rowcount == 0:
            raise NotFound(f"no organization named {name!r}")
        return self.org_by_name(name)

    def create_key(self, org_id: str, *, scopes: tuple[str, ...] = ALL_SCOPES,
                   budget_nano_usd: int | None = None, hard_budget: bool = False) -> tuple[ApiKey, str]:
        """A new key; the secret is returned once and only its hash is kept. ``hard_budget``: its creates reserve
        their maximum cost (store/budgets.py)."""
        unknown = set(scopes) - set(ALL_SCOPES)
        if unknown or not scopes:
            raise Conflict(f"unknown scopes: {', '.join(sorted(unknown)) or '(none given)'}", code="bad_scopes")
        secret = new_api_key()
        key_id = new_key_id()
        with self.db.write() as conn:
            conn.execute(api_keys.insert().values(
                id=key_id, org_id=org_id, key_hash=hash_key(secret), prefix=secret[:12],
                scopes=",".join(scopes), budget_nano_usd=budget_nano_usd, spent_nano_usd=0, created_at=now(),
                hard_budget=hard_budget, reserved_nano_usd=0,
            ))
        return self.key(key_id), secret

    def key(self, key_id: str) -> ApiKey:
        with self.db.read() as conn:
            row = conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).first()
        if row is None:
            raise NotFound(f"no key {key_id!r}")
        return _key(row)

    def list_keys(self, org_id: str | None = None) -> list[ApiKey]:
        query = sa.select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id)
        if org_id is not None:
            query = query.where(api_keys.c.org_id == org_id)
        with self.db.read() as conn:
            return [_key(r) for r in conn.execute(query).all()]

    def revoke_key(self, key_id: str) -> ApiKey:
        with self.db.write() as conn:
            done = conn.execute(api_keys.update().where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                                .values(revoked_at=now()))
        if done.rowcount == 0:
            self.key(key_id)  # raises NotFound for an unknown id; otherwise it was already revoked
        return self.key(key_id)

    def set_budget(self, key_id: str, budget_nano_usd: int | None, *, hard_budget: bool | None = None) -> ApiKey:
        """Replace a key's spend budget (None: unlimited), and make it hard or not when ``hard_budget`` says. What
        it spent and what its running batches reserved stay."""
        values: dict[str, object] = {"budget_nano_usd": budget_nano_usd}
        if hard_budget is not None:
            values["hard_budget"] = hard_budget
        return self._set(key_id, values)

    def set_hard_budget(self, key_id: str, hard_budget: bool) -> ApiKey:
        """Make a key's budget hard (its creates reserve their maximum cost) or not, keeping the budget."""
        return self._set(key_id, {"hard_budget": hard_budget})

    def _set(self, key_id: str, values: dict[str, object]) -> ApiKey:
        with self.db.write() as conn:
            done = conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(**values))
        if done.rowcount == 0:
            raise NotFound(f"no key {key_id!r}")
        return self.key(key_id)

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key with this secret, or None."""
        digest = hash_key(secret)
        with self.db.read() as conn:
            row = conn.execute(_BY_HASH, {"digest": digest}).first()
        if row is None or not hmac.compare_digest(row.key_hash, digest) or row.revoked_at is not None:
            return None
        return _key(row)


_BY_HASH = sa.select(api_keys).where(api_keys.c.key_hash == sa.bindparam("digest"))  # built once: every write asks
