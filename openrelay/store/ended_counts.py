"""Counters of ended batches (``ended_batch_counts``): what the dashboard's summary reads, so its cost does not grow
with the batches a store keeps. An ended batch never changes, so it is added in the transaction that ends it
(``Results._finalize``), taken off in the one that prunes it, and moved by a metadata edit of its tags; each batch
counted in the row of its creation day and in the every-day row (``ALL_DAYS``). docs/deploy.md, "A store a year old"."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..types import DAY_SECONDS, TERMINAL_VALUES
from .schema import batch_tags, batches, ended_batch_counts

__all__ = ["count_ended", "ended_totals", "ended_sizes", "EVERY_BATCH", "ALL_DAYS"]

EVERY_BATCH = ""  # the tag of the rows that count every batch
ALL_DAYS = -1  # the created_day of the rows that count every day
_KEY = ("org_id", "tag", "status", "model", "priority", "created_day")
_SUMS = ("batches", "input_tokens", "output_tokens", "cost_nano_usd")
_c = ended_batch_counts.c


def count_ended(conn: Connection, batch_ids: Sequence[str], *, sign: int) -> None:
    """Add (``sign`` 1) or take off (-1) these batches, those of them that ended, as they stand in this
    transaction (status, usage, tags). The caller holds their rows (it just updated them, or locked them)."""
    if not batch_ids:
        return
    b = batches.c
    rows = conn.execute(sa.select(b.id, b.org_id, b.status, b.model, b.priority, b.created_at, b.input_tokens,
                                  b.output_tokens, b.cost_nano_usd)
                        .where(b.id.in_(batch_ids), b.status.in_(TERMINAL_VALUES))).all()
    if not rows:
        return
    tags: dict[str, list[str]] = defaultdict(list)
    for batch_id, tag in conn.execute(sa.select(batch_tags.c.batch_id, batch_tags.c.tag)
                                      .where(batch_tags.c.batch_id.in_([r.id for r in rows]))):
        tags[batch_id].append(tag)
    deltas: dict[tuple[Any, ...], list[int]] = {}
    for r in rows:
        for tag in (EVERY_BATCH, *tags[r.id]):
            for day in (r.created_at // DAY_SECONDS, ALL_DAYS):
                sums = deltas.setdefault((r.org_id, tag, r.status, r.model, r.priority, day), [0, 0, 0, 0])
                for i, value in enumerate((1, r.input_tokens, r.output_tokens, r.cost_nano_usd)):
                    sums[i] += int(value)
    ordered = dict(sorted(deltas.items()))  # every transaction locks counter rows in one order: no deadlock
    if sign > 0:
        _add(conn, ordered)
    else:
        _take_off(conn, ordered)


def _add(conn: Connection, deltas: dict[tuple[Any, ...], list[int]]) -> None:
    insert = (sqlite if conn.dialect.name == "sqlite" else postgresql).insert(ended_batch_counts)
    upsert = insert.on_conflict_do_update(index_elements=list(_KEY),
                                          set_={name: _c[name] + insert.excluded[name] for name in _SUMS})
    conn.execute(upsert, [dict(zip(_KEY + _SUMS, (*key, *sums), strict=True)) for key, sums in deltas.items()])


def _take_off(conn: Connection, deltas: dict[tuple[Any, ...], list[int]]) -> None:
    """Subtract; a row that counts no batch any more goes, so the table holds only what some batch needs."""
    where = [_c[name] == sa.bindparam(f"k_{name}") for name in _KEY]
    params = [{**{f"k_{name}": value for name, value in zip(_KEY, key, strict=True)},
               **{f"d_{name}": value for name, value in zip(_SUMS, sums, strict=True)}}
              for key, sums in deltas.items()]
    conn.execute(ended_batch_counts.update().where(*where).values(
        {name: _c[name] - sa.bindparam(f"d_{name}") for name in _SUMS}), params)
    conn.execute(ended_batch_counts.delete().where(*where, _c.batches <= 0),
                 [{k: v for k, v in p.items() if k.startswith("k_")} for p in params])


def ended_totals(conn: Connection, org_id: str, *, tag: str = EVERY_BATCH, statuses: Sequence[str] = TERMINAL_VALUES,
                 model: str | None = None, priority: str | None = None, from_day: int | None = None,
                 to_day: int | None = None) -> list[tuple[str, int, int, int, int]]:
    """Per terminal status in ``statuses``: (status, batches, input tokens, output tokens, cost) of the
    organization's ended batches under these filters (days: ``from_day`` <= created day < ``to_day``). Reads the
    organization's rows of one tag: at most statuses x models x priorities (x the days of the range, if one is
    given), however many batches that is."""
    conditions = [_c.org_id == org_id, _c.tag == tag, _c.status.in_(list(statuses))]
    if model is not None:
        conditions.append(_c.model == model)
    if priority is not None:
        conditions.append(_c.priority == priority)
    if from_day is None and to_day is None:
        conditions.append(_c.created_day == ALL_DAYS)
    else:
        conditions.append(_c.created_day >= max(from_day or 0, 0))
        if to_day is not None:
            conditions.append(_c.created_day < to_day)
    query = (sa.select(_c.status, sa.func.sum(_c.batches), sa.func.sum(_c.input_tokens),
                       sa.func.sum(_c.output_tokens), sa.func.sum(_c.cost_nano_usd))
             .where(*conditions).group_by(_c.status))
    return [(status, int(n or 0), int(i or 0), int(o or 0), int(cost or 0))
            for status, n, i, o, cost in conn.execute(query)]


def ended_sizes(conn: Connection, org_id: str, tags: Sequence[str]) -> dict[str, int]:
    """How many of the organization's ended batches carry each of ``tags`` (``EVERY_BATCH``: every batch; 0 for a
    tag none carries): the every-day rows of those tags, at most statuses x models x priorities each. What a page
    or a summary should walk first is told by these (store/batch_search.py); the batches not yet ended are left
    out, as few as are live."""
    query = (sa.select(_c.tag, sa.func.sum(_c.batches))
             .where(_c.org_id == org_id, _c.tag.in_(list(tags)), _c.status.in_(TERMINAL_VALUES),
                    _c.created_day == ALL_DAYS).group_by(_c.tag))
    return {tag: 0 for tag in tags} | {tag: int(n or 0) for tag, n in conn.execute(query)}
