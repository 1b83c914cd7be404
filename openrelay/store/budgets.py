"""Hard budgets, opt-in per key: reserve a batch's maximum cost when it is created, turn the reservation into spend
as its records settle, release what is left when it ends; each a statement in a transaction that does the rest of
its work, the reservation one conditional ``UPDATE`` of the key's row. docs/design.md, "Hard budgets"."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import BudgetExceeded
from ..money import usd_text
from ..types import ApiKey
from .schema import api_keys, batches

__all__ = ["over_budget", "reserve", "settle", "release"]


def over_budget(key: ApiKey, max_cost_nano_usd: int) -> BudgetExceeded:
    """The 402 of a create whose maximum cost does not fit in what is left of its key's hard budget."""
    left = key.budget_left() or 0
    return BudgetExceeded(
        f"this batch may cost up to {usd_text(max_cost_nano_usd)} ({max_cost_nano_usd} nano-USD) and this key's "
        f"hard budget has {usd_text(left)} left ({left} nano-USD of {key.budget_nano_usd}: "
        f"{key.spent_nano_usd} spent, {key.reserved_nano_usd} reserved by batches still running)",
        extra={"max_cost_nano_usd": max_cost_nano_usd, "budget_left_nano_usd": left})


def reserve(conn: Connection, key: ApiKey, max_cost_nano_usd: int) -> None:
    """Add ``max_cost_nano_usd`` to the key's reservation if it fits what is left now, else raise ``over_budget``
    (with the key as the store holds it now); the caller's transaction then makes nothing. The caller has checked
    ``ApiKey.fits`` on the key it read, so the amount is at most the budget and the sum cannot overflow."""
    c = api_keys.c
    done = conn.execute(api_keys.update().where(
        c.id == key.id,
        sa.or_(c.budget_nano_usd.is_(None),
               c.spent_nano_usd + c.reserved_nano_usd + max_cost_nano_usd <= c.budget_nano_usd),
    ).values(reserved_nano_usd=c.reserved_nano_usd + max_cost_nano_usd))
    if done.rowcount == 0:
        row = conn.execute(sa.select(c.budget_nano_usd, c.spent_nano_usd, c.reserved_nano_usd)
                           .where(c.id == key.id)).one()
        raise over_budget(dataclasses.replace(key, budget_nano_usd=row.budget_nano_usd,
                                              spent_nano_usd=row.spent_nano_usd,
                                              reserved_nano_usd=row.reserved_nano_usd), max_cost_nano_usd)


def settle(conn: Connection, *, batch_id: str, key_id: str, reserved: int, cost_nano_usd: int) -> None:
    """A chunk's cost: added to the key's spend, and as much of it as the batch still holds (``reserved``, read in
    this transaction) taken off both reservations. A batch that costs more than its maximum (approximate token
    counts) spends past its reservation; the reservation never goes below 0."""
    released = min(reserved, cost_nano_usd)
    if released:
        conn.execute(_BATCH_RELEASES, {"batch_id": batch_id, "released": released})
    if cost_nano_usd or released:
        conn.execute(_KEY_SPENDS, {"key_id": key_id, "cost": cost_nano_usd, "released": released})


def release(conn: Connection, *, batch_id: str, key_id: str, reserved: int) -> None:
    """The batch has ended: what it still holds (``reserved``, read in this transaction) goes back to its key."""
    if reserved:
        conn.execute(_BATCH_HOLDS_NOTHING, {"batch_id": batch_id})
        conn.execute(_KEY_SPENDS, {"key_id": key_id, "cost": 0, "released": reserved})


# Built once: a chunk's commit and a batch's end run them (the values are parameters).
_BATCH_RELEASES = batches.update().where(batches.c.id == sa.bindparam("batch_id")).values(
    reserved_nano_usd=batches.c.reserved_nano_usd - sa.bindparam("released"))
_BATCH_HOLDS_NOTHING = batches.update().where(batches.c.id == sa.bindparam("batch_id")).values(reserved_nano_usd=0)
_KEY_SPENDS = api_keys.update().where(api_keys.c.id == sa.bindparam("key_id")).values(
    spent_nano_usd=api_keys.c.spent_nano_usd + sa.bindparam("cost"),
    reserved_nano_usd=api_keys.c.reserved_nano_usd - sa.bindparam("released"))
