"""A batch's tags as rows of ``batch_tags``: how they are written and how a list is narrowed by them.

The ``tags`` metadata value stays the truth (the API returns it as written); ``batch_tags`` holds what
``types.tag_list`` reads from it, one row per tag, so "this organization's batches with tag T, newest first" is
a range of the index ``(org_id, tag, created_ns, batch_id)``. The rows change only in the transaction that
changes the metadata (create, metadata edit), so a list never sees one without the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..types import tag_list
from .schema import batch_tags, batches

__all__ = ["tag_rows", "insert_tags", "replace_tags", "tagged", "carries"]


def tag_rows(*, batch_id: str, org_id: str, created_ns: int,
             metadata: dict[str, str] | None) -> list[dict[str, Any]]:
    """The rows of a batch with this metadata. A tag holding NUL gets none: PostgreSQL cannot store it, and a
    filter holding NUL finds nothing on either store (``db.holds_nul``) without asking."""
    return [{"batch_id": batch_id, "org_id": org_id, "tag": tag, "created_ns": created_ns}
            for tag in tag_list(metadata) if "\x00" not in tag]


def insert_tags(conn: Connection, *, batch_id: str, org_id: str, created_ns: int,
                metadata: dict[str, str] | None) -> None:
    rows = tag_rows(batch_id=batch_id, org_id=org_id, created_ns=created_ns, metadata=metadata)
    if rows:
        conn.execute(batch_tags.insert(), rows)


def replace_tags(conn: Connection, *, batch_id: str, org_id: str, created_ns: int,
                 metadata: dict[str, str] | None) -> None:
    """After a metadata edit: the old tags go, the new ones come (in the edit's transaction)."""
    conn.execute(batch_tags.delete().where(batch_tags.c.batch_id == batch_id))
    insert_tags(conn, batch_id=batch_id, org_id=org_id, created_ns=created_ns, metadata=metadata)


def tagged(org_id: Any, tags: Sequence[Any]) -> tuple[sa.FromClause, list[sa.ColumnElement[bool]],
                                                      tuple[sa.ColumnElement[Any], sa.ColumnElement[Any]]]:
    """The organization's batches carrying every one of ``tags`` (values or bind parameters, at least one):
    the FROM clause, its conditions, and the (created_ns, id) pair to order and page by. Give the rarest tag
    first (store/batch_search.py asks the counters which it is): its batches are the ones walked.

    The first tag is a range of ``ix_batch_tags_org_tag_order`` read newest first, joined to ``batches`` by
    primary key; each further tag is an EXISTS on ``batch_tags``, which the planner answers by the primary key
    (batch_id, tag) or, as a semi-join, by that tag's range of the same index (hence its org_id). Order and paging
    use the index's own columns, so a page stops after its rows instead of sorting every tagged batch."""
    first, *more = tags
    source = batch_tags.join(batches, batches.c.id == batch_tags.c.batch_id)
    conditions: list[sa.ColumnElement[bool]] = [batch_tags.c.org_id == org_id, batch_tags.c.tag == first,
                                                batches.c.org_id == org_id]
    for index, tag in enumerate(more):
        other = batch_tags.alias(f"also_tagged_{index}")
        conditions.append(sa.exists().where(other.c.batch_id == batch_tags.c.batch_id, other.c.org_id == org_id,
                                            other.c.tag == tag))
    return source, conditions, (batch_tags.c.created_ns, batch_tags.c.batch_id)


def carries(tag: Any) -> sa.ColumnElement[bool]:
    """The condition on ``batches`` that its batch carries ``tag``: one probe of ``batch_tags``' primary key."""
    return sa.exists().where(batch_tags.c.batch_id == batches.c.id, batch_tags.c.tag == tag)

