"""The dashboard's reads of batches: a page under any mix of its filters, and the summary of the filtered set. Every
condition is SQL; tags are rows (store/tags.py), text goes through its index (store/batch_text.py), the summary
reads the counters of ended batches (store/ended_counts.py), which also choose the index a page walks (``_walk``):
the answers never depend on that choice. docs/dashboard.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import no_such
from ..types import (
    DAY_SECONDS,
    LIVE_VALUES,
    SHOWN_QUEUED,
    SHOWN_RUNNING,
    TERMINAL_VALUES,
    Batch,
    BatchStatus,
    shown_status,
)
from .batch_rows import batch_from_row
from .batch_text import fts_leads, plan_for_the_values, text_condition
from .db import Database, holds_nul
from .ended_counts import EVERY_BATCH, ended_sizes, ended_totals
from .schema import batches
from .tags import carries, tagged

__all__ = ["BatchQuery", "Summary", "search", "summarize"]


@dataclass(frozen=True, kw_only=True)
class BatchQuery:
    """What the dashboard filters on; every field narrows (tags: the batch carries all of them)."""

    status: str | None = None  # a BatchStatus value, or a shown one (types.SHOWN_QUEUED, SHOWN_RUNNING)
    model: str | None = None
    priority: str | None = None
    tags: tuple[str, ...] = ()
    text: str | None = None  # a substring of the id or of the metadata (keys and values), any case
    created_from: int | None = None  # created_at >= this (seconds)
    created_to: int | None = None  # created_at < this


@dataclass(kw_only=True)
class Summary:
    counts: dict[str, int] = field(default_factory=dict)  # per shown status (types.shown_status)
    batches: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nano_usd: int = 0


def _status_conditions(status: str | None) -> list[sa.ColumnElement[bool]]:
    if status == SHOWN_QUEUED:
        return [batches.c.status == BatchStatus.IN_PROGRESS.value, batches.c.in_progress_at.is_(None)]
    if status == SHOWN_RUNNING:
        return [batches.c.status == BatchStatus.IN_PROGRESS.value, batches.c.in_progress_at.is_not(None)]
    return [batches.c.status == status] if status else []


def _created_conditions(query: BatchQuery) -> list[sa.ColumnElement[bool]]:
    """The created range on ``created_at``, and the same range, a minute wider, on ``created_ns`` (taken a moment
    apart from it), so that a page walks its index from the range's end instead of from the newest batch."""
    found: list[sa.ColumnElement[bool]] = []
    if query.created_from is not None:
        found += [batches.c.created_at >= query.created_from,
                  batches.c.created_ns >= (query.created_from - _NS_SLACK) * 1_000_000_000]
    if query.created_to is not None:
        found += [batches.c.created_at < query.created_to,
                  batches.c.created_ns < (query.created_to + _NS_SLACK) * 1_000_000_000]
    return found


_NS_SLACK = 60


def _walk(conn: Connection, org_id: str, query: BatchQuery) -> tuple[str, ...]:
    """The tags in the order ``_filtered`` should walk them, the rarest first; or none, when the status or model
    filter keeps fewer batches than every tag (then the organization's index of that filter leads, and each tag
    is a probe of ``batch_tags``' primary key). Sizes are the counters' ended batches (``ended_counts``): a
    status not ended (queued, running, ...) keeps none of those, so it leads (its batches are the live ones)."""
    if not query.tags:
        return ()
    sizes = ended_sizes(conn, org_id, query.tags)
    rarest = sorted(query.tags, key=sizes.__getitem__)  # stable: equal sizes keep the order given
    rivals = []
    if query.status:
        rivals.append(sum(row[1] for row in ended_totals(conn, org_id, statuses=[query.status])))
    if query.model:
        rivals.append(sum(row[1] for row in ended_totals(conn, org_id, model=query.model)))
    return () if rivals and min(rivals) < sizes[rarest[0]] else tuple(rarest)


def _filtered(org_id: str, query: BatchQuery, *, is_sqlite: bool, walk: tuple[str, ...] | None = None) -> tuple[
        sa.FromClause, list[sa.ColumnElement[bool]], tuple[sa.ColumnElement[Any], sa.ColumnElement[Any]]]:
    """What to select from, the conditions, and the (created_ns, id) pair to order and page by: under ``walk``
    (``_walk``'s tags; ``query.tags`` as given when None), the batches carrying every tag (``tags.tagged``);
    otherwise the organization's batches (walked by the index of the status or model filter where there is one),
    each tag a probe (``tags.carries``)."""
    walk = query.tags if walk is None else walk
    if walk:
        source, found, order = tagged(org_id, walk)
    else:
        mine: sa.ColumnElement[str] = batches.c.org_id
        if query.text and fts_leads(query.text, is_sqlite=is_sqlite):
            mine = mine.concat("")  # the text index's matches lead (batch_text.fts_leads)
        source, found, order = batches, [mine == org_id], (batches.c.created_ns, batches.c.id)
        found += [carries(tag) for tag in query.tags]
    found += _status_conditions(query.status)
    if query.model:
        found.append(batches.c.model == query.model)
    if query.priority:
        found.append(batches.c.priority == query.priority)
    if query.text:
        found.append(text_condition(query.text, is_sqlite=is_sqlite))
    found += _created_conditions(query)
    return source, found, order


def _impossible(query: BatchQuery) -> bool:
    """No stored text holds NUL (and PostgreSQL cannot be asked about one)."""
    return holds_nul(query.status, query.model, query.priority, query.text, *query.tags)


def search(db: Database, org_id: str, query: BatchQuery, *, limit: int,
           after: str | None = None) -> tuple[list[Batch], bool]:
    """Newest first, after the batch ``after`` (404 when the organization has none such); has_more."""
    if after is not None and holds_nul(after):
        raise no_such("Batch", after, param="after")
    if _impossible(query):
        return [], False
    with db.read() as conn:
        source, conditions, order = _filtered(org_id, query, is_sqlite=db.is_sqlite, walk=_walk(conn, org_id, query))
        select = sa.select(batches).select_from(source).where(*conditions)
        if query.text or query.tags:
            plan_for_the_values(conn)
        if after:
            anchor = conn.execute(sa.select(batches.c.created_ns, batches.c.id).where(
                batches.c.id == after, batches.c.org_id == org_id)).first()
            if anchor is None:
                raise no_such("Batch", after, param="after")
            select = select.where(sa.tuple_(*order) < sa.tuple_(*anchor))
        select = select.order_by(*(column.desc() for column in order)).limit(limit + 1)
        found = [batch_from_row(row) for row in conn.execute(select)]
    return found[:limit], len(found) > limit


def summarize(db: Database, org_id: str, query: BatchQuery) -> Summary:
    """Counts per shown status and the usage of every batch the filters keep (not just one page): the counters
    plus the live batches where they can answer (``_counted``), else an aggregate of the matching batches (``_walk``).
    One snapshot for both halves, so a batch that ends meanwhile is counted once."""
    summary = Summary()
    if _impossible(query):
        return summary
    with db.read() as conn:
        if not db.is_sqlite:  # each statement would otherwise see its own snapshot
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if _counted(query):
            rows = _ended_rows(conn, org_id, query)
            if query.status not in TERMINAL_VALUES:
                rows += _aggregate(conn, *_live(org_id, query))
        else:
            if query.text or query.tags:
                plan_for_the_values(conn)
            walk = _walk(conn, org_id, query)
            source, conditions, _order = _filtered(org_id, query, is_sqlite=db.is_sqlite, walk=walk)
            rows = _aggregate(conn, source, conditions)
    for shown, count, input_tokens, output_tokens, cost in rows:
        _add(summary, shown, count, input_tokens, output_tokens, cost)
    return summary


def _counted(query: BatchQuery) -> bool:
    """Whether the counters answer these filters: no text, at most one tag, a created range of whole UTC days
    (the dashboard's date inputs always are)."""
    whole_days = all(bound is None or bound % DAY_SECONDS == 0 for bound in (query.created_from, query.created_to))
    return not query.text and len(query.tags) <= 1 and whole_days


def _ended_rows(conn: Connection, org_id: str, query: BatchQuery) -> list[tuple[str, int, int, int, int]]:
    statuses = TERMINAL_VALUES if query.status is None else [s for s in TERMINAL_VALUES if s == query.status]
    if not statuses:
        return []
    return ended_totals(conn, org_id, tag=query.tags[0] if query.tags else EVERY_BATCH, statuses=statuses,
                        model=query.model, priority=query.priority,
                        from_day=None if query.created_from is None else query.created_from // DAY_SECONDS,
                        to_day=None if query.created_to is None else query.created_to // DAY_SECONDS)


def _live(org_id: str, query: BatchQuery) -> tuple[sa.FromClause, list[sa.ColumnElement[bool]]]:
    """The organization's batches not yet ended under these filters: a range of (org_id, status) per live status,
    each further filter checked on those rows (a tag by ``batch_tags``' primary key)."""
    conditions = [batches.c.org_id == org_id, batches.c.status.in_(LIVE_VALUES), *_status_conditions(query.status)]
    if query.model:
        conditions.append(batches.c.model == query.model)
    if query.priority:
        conditions.append(batches.c.priority == query.priority)
    conditions += [carries(tag) for tag in query.tags]
    return batches, conditions + _created_conditions(query)


def _aggregate(conn: Connection, source: sa.FromClause,
               conditions: list[sa.ColumnElement[bool]]) -> list[tuple[str, int, int, int, int]]:
    running = sa.case((batches.c.in_progress_at.is_(None), 0), else_=1)
    select = (sa.select(batches.c.status, running, sa.func.count(), sa.func.sum(batches.c.input_tokens),
                        sa.func.sum(batches.c.output_tokens), sa.func.sum(batches.c.cost_nano_usd))
              .select_from(source).where(*conditions).group_by(batches.c.status, running))
    return [(shown_status(status, 1 if started else None), count, int(i or 0), int(o or 0), int(cost or 0))
            for status, started, count, i, o, cost in conn.execute(select).all()]


def _add(summary: Summary, shown: str, count: int, input_tokens: int, output_tokens: int, cost: int) -> None:
    summary.counts[shown] = summary.counts.get(shown, 0) + count
    summary.batches += count
    summary.input_tokens += int(input_tokens)
    summary.output_tokens += int(output_tokens)
    summary.cost_nano_usd += int(cost)
