"""The dashboard's text search (``q``) through an index (PostgreSQL: pg_trgm GIN indexes; SQLite: an FTS5 trigram
table kept by triggers), which only narrows the rows the scan's ``LIKE`` is checked on, so the answer is the scan's.
A text under 3 characters has no trigram: the ``LIKE`` alone. docs/deploy.md, "A store a year old"."""

from __future__ import annotations

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import batches

__all__ = ["text_condition", "create_text_index", "fts_leads", "plan_for_the_values", "MIN_INDEXED_CHARACTERS"]

MIN_INDEXED_CHARACTERS = 3  # a trigram
_FTS = sa.table("batch_text", sa.column("rowid"))
_SQLITE_INDEX = (
    "CREATE VIRTUAL TABLE batch_text USING fts5(id, metadata, content='batches', tokenize='trigram')",
    "CREATE TRIGGER batch_text_insert AFTER INSERT ON batches BEGIN "
    "INSERT INTO batch_text (rowid, id, metadata) VALUES (new.rowid, new.id, new.metadata); END",
    "CREATE TRIGGER batch_text_delete AFTER DELETE ON batches BEGIN "
    "INSERT INTO batch_text (batch_text, rowid, id, metadata) VALUES ('delete', old.rowid, old.id, old.metadata); "
    "END",
    "CREATE TRIGGER batch_text_update AFTER UPDATE OF metadata ON batches BEGIN "
    "INSERT INTO batch_text (batch_text, rowid, id, metadata) VALUES ('delete', old.rowid, old.id, old.metadata); "
    "INSERT INTO batch_text (rowid, id, metadata) VALUES (new.rowid, new.id, new.metadata); END",
)
_POSTGRES_INDEX = (
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX ix_batches_text_id ON batches USING gin (lower(id) gin_trgm_ops)",
    "CREATE INDEX ix_batches_text_metadata ON batches USING gin (lower(metadata) gin_trgm_ops)",
)


def create_text_index(conn: Connection) -> None:
    """The baseline migration's hook: the text index of a new store."""
    for statement in _SQLITE_INDEX if conn.dialect.name == "sqlite" else _POSTGRES_INDEX:
        conn.exec_driver_sql(statement)


def _like_literal(text: str) -> str:
    return "%" + text.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"


def _json_spelling(text: str) -> str:
    """``text`` as it is spelled inside the stored JSON text of the metadata (quotes, backslashes escaped)."""
    return orjson.dumps(text).decode()[1:-1]


def fts_leads(text: str, *, is_sqlite: bool) -> bool:
    """Whether a search for ``text`` reads SQLite's FTS5 index. Its matches should then be where the query
    starts: without statistics SQLite's planner would rather walk the organization's index (every batch of it)
    and look each one up in the matches, so the caller hides the organization's column from it
    (``org_id || ''``), and the organization is checked on each match instead."""
    return is_sqlite and len(_json_spelling(text)) >= MIN_INDEXED_CHARACTERS


def plan_for_the_values(conn: Connection) -> None:
    """PostgreSQL: plan this transaction's statements for their actual parameters. The driver prepares a statement
    run a few times, and the server then plans it once for any parameters: a plan that cannot know the text is
    rare, so it intersects the trigram matches with the organization's every batch (95 ms at 100,000 batches,
    against 0.5 ms when planned for the text); one that cannot know two tags misjudges how many batches carry each
    (a summary of two tags at 3,000 of the organization's batches: 7 ms planned for them, 65 to 100 ms once the
    server's generic plan took over). Store/batch_search.py calls it for text and tag filters."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")


def text_condition(text: str, *, is_sqlite: bool) -> sa.ColumnElement[bool]:
    """Batches whose id or metadata holds ``text``, any case."""
    spelled = _json_spelling(text)
    scan = sa.or_(sa.func.lower(batches.c.id).like(_like_literal(text.lower()), escape="/"),
                  sa.func.lower(batches.c.metadata).like(_like_literal(spelled.lower()), escape="/"))
    if not fts_leads(text, is_sqlite=is_sqlite):
        return scan  # PostgreSQL's planner picks the trigram indexes for the LIKE itself
    # An id holds no character JSON escapes, so the metadata's spelling finds the ids that hold the text too.
    phrase = '"' + spelled.replace('"', '""') + '"'
    found = sa.select(_FTS.c.rowid).where(sa.literal_column("batch_text").op("MATCH")(phrase))
    return sa.and_(sa.literal_column("batches.rowid").in_(found), scan)
