"""The dashboard's reads of batches: a page under any mix of its filters, and the summary of the filtered set.

Kept apart from ``batches.py`` (the API's list) and ``leases.py`` (the workers' claims): the dashboard filters on
more than the API does (several tags, queued apart from running, priority, a created range, text over id and
metadata), and summarises what it filters. Every condition is SQL; tags are rows of ``batch_tags``
(store/tags.py), so a page and a summary under tag filters read the first tag's index range instead of every
batch's metadata text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

from ..errors import no_such
from ..types import SHOWN_QUEUED, SHOWN_RUNNING, Batch, BatchStatus, shown_status
from .batch_rows import batch_from_row
from .db import Database, holds_nul
from .schema import batches
from .tags import tagged

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


def _like_literal(text: str) -> str:
    return "%" + text.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"


def _json_spelling(text: str) -> str:
    """``text`` as it is spelled inside the stored JSON text of the metadata (quotes, backslashes escaped)."""
    return orjson.dumps(text).decode()[1:-1]


def _filtered(org_id: str, query: BatchQuery) -> tuple[sa.FromClause, list[sa.ColumnElement[bool]],
                                                     tuple[sa.ColumnElement[Any], sa.ColumnElement[Any]]]:
    """What to select from, the conditions, and the (created_ns, id) pair to order and page by: the
    organization's batches (walked by the index of the status or model filter where there is one), or, under
    tag filters, the batches carrying every tag (``tags.tagged``)."""
    if query.tags:
        source, found, order = tagged(org_id, query.tags)
    else:
        source, found, order = batches, [batches.c.org_id == org_id], (batches.c.created_ns, batches.c.id)
    if query.status == SHOWN_QUEUED:
        found += [batches.c.status == BatchStatus.IN_PROGRESS.value, batches.c.in_progress_at.is_(None)]
    elif query.status == SHOWN_RUNNING:
        found += [batches.c.status == BatchStatus.IN_PROGRESS.value, batches.c.in_progress_at.is_not(None)]
    elif query.status:
        found.append(batches.c.status == query.status)
    if query.model:
        found.append(batches.c.model == query.model)
    if query.priority:
        found.append(batches.c.priority == query.priority)
    if query.text:
        pattern = _like_literal(query.text.lower())
        found.append(sa.or_(sa.func.lower(batches.c.id).like(pattern, escape="/"),
                            sa.func.lower(batches.c.metadata).like(_like_literal(_json_spelling(query.text)
                                                                                 .lower()), escape="/")))
    if query.created_from is not None:
        found.append(batches.c.created_at >= query.created_from)
    if query.created_to is not None:
        found.append(batches.c.created_at < query.created_to)
    return source, found, order


def _impossible(query: BatchQuery) -> bool:
    """No stored text holds NUL (and PostgreSQL cannot be asked about one)."""
    return holds_nul(query.status, query.model, query.priority, query.text, *query.tags)


def search(db: Database, org_id: str, query: BatchQuery, *, limit: int,
           after: str | None = None) -> tuple[list[Batch], bool]:
    """Newest first, after the batch ``after`` (404 when the organization has none such); has_more."""
    if holds_nul(after):
        raise no_such("Batch", after, param="after")
    if _impossible(query):
        return [], False
    source, conditions, order = _filtered(org_id, query)
    select = sa.select(batches).select_from(source).where(*conditions)
    with db.read() as conn:
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
    """Counts per shown status and the usage of every batch the filters keep (not just one page)."""
    summary = Summary()
    if _impossible(query):
        return summary
    running = sa.case((batches.c.in_progress_at.is_(None), 0), else_=1)
    source, conditions, _order = _filtered(org_id, query)
    select = (sa.select(batches.c.status, running, sa.func.count(), sa.func.sum(batches.c.input_tokens),
                        sa.func.sum(batches.c.output_tokens), sa.func.sum(batches.c.cost_nano_usd))
              .select_from(source).where(*conditions).group_by(batches.c.status, running))
    with db.read() as conn:
        for status, started, count, input_tokens, output_tokens, cost in conn.execute(select).all():
            _add(summary, shown_status(status, 1 if started else None), count, input_tokens or 0,
                 output_tokens or 0, cost or 0)
    return summary


def _add(summary: Summary, shown: str, count: int, input_tokens: int, output_tokens: int, cost: int) -> None:
    summary.counts[shown] = summary.counts.get(shown, 0) + count
    summary.batches += count
    summary.input_tokens += int(input_tokens)
    summary.output_tokens += int(output_tokens)
    summary.cost_nano_usd += int(cost)
