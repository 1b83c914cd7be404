"""Fill a store with a year of batches (issue 24 part 3): organizations, their batches with metadata, tags,
settled counts and chunk rows, on SQLite or PostgreSQL, fast enough for a million.

    .venv/bin/python bench/seed_store.py --database-url URL [--batches 1000000] [--orgs 1000] [--live 200]

Not through the API (far too slow for a million): the rows are written in big transactions, SQLAlchemy Core
executemany on SQLite and COPY on PostgreSQL, shaped by the store's own code (``batch_rows.batch_values`` for a
batch as a create writes it, ``tags.tag_rows`` for its tags, the ``batch_chunks`` columns a chunk commit
writes), then moved to where a worker leaves them: most ended (completed, then failed, cancelled, expired) with
their usage, result file ids and one chunk row, over the year up to yesterday; ``--live`` batches created in the
last hours, queued, running (leased by a worker that holds them), validating, finalizing or cancelling.
Organization 0 holds one batch in ten; the others share the rest.

The rows go into a migrated store; each block's ended batches are counted for the summary by the store's own
``ended_counts.count_ended`` as each block is written, as a batch's end counts it, and the text index of q is
kept by the store (SQLite's triggers, PostgreSQL's GIN indexes) as the rows go in. No file rows are written: no
read measured here joins them. The organizations and keys are made by ``Accounts``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.store.accounts import Accounts  # noqa: E402
from openrelay.store.batch_rows import batch_values  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from openrelay.store.ended_counts import count_ended  # noqa: E402
from openrelay.store.schema import batch_chunks, batch_tags, batches  # noqa: E402
from openrelay.store.tags import tag_rows  # noqa: E402
from openrelay.types import DAY_SECONDS, Batch, BatchStatus  # noqa: E402

__all__ = ["Seeded", "seed", "MODELS", "TAGS", "MAIN_ORG", "SEARCHED"]

MODELS = (("meta/llama-3.1-8b", 50), ("qwen/qwen3-32b", 25), ("mistral/small-3.1", 15), ("google/gemma-3-27b", 8),
          ("bench/rare", 2))
TAGS = ("nightly", "eval", "prod", "staging", "team-search", "team-ads", "team-ml", "backfill", "weekly", "eu",
        "us", "apac", "experiment", "ab-test", "cohort-a", "cohort-b", "reindex", "summaries", "embeddings",
        "classify", "translate", "moderation", "v1", "v2", "customer-42", "customer-77", "pilot", "qa", "smoke",
        "rare-tag")
MAIN_ORG = "year-org-0000"
# The job name of 20 of the measured organization's batches holds this text, in a store of any size: a search
# whose matches do not grow with the store.
SEARCHED = "needle"
_SEARCHED_BATCHES = 20
ENDED = ((BatchStatus.COMPLETED, 90), (BatchStatus.FAILED, 5), (BatchStatus.CANCELLED, 3), (BatchStatus.EXPIRED, 2))
LIVE = (("queued", 60), ("running", 20), ("validating", 5), ("finalizing", 5), ("cancelling", 10))
_BLOCK = 20_000  # rows generated and written at a time
_HOLDER = "seed-worker"  # the worker that holds the running batches' leases (far in the future)


@dataclass(frozen=True, kw_only=True)
class Seeded:
    org_id: str  # the measured organization (MAIN_ORG)
    secret: str  # an every-scope key of it
    batches: int  # of that organization
    seconds: float


def _metadata(rng: random.Random, n: int) -> dict[str, str]:
    job = f"{SEARCHED}-{n}" if n < 10 * _SEARCHED_BATCHES and n % 10 == 0 else f"job-{n % 997}"
    found = {"job": job, "owner": rng.choice(("ana", "bo", "chen", "dara", "eli"))}
    if rng.random() >= 0.2:
        weights = [1.0 / (i + 1) for i in range(len(TAGS) - 1)] + [0.01]
        found["tags"] = ",".join(dict.fromkeys(rng.choices(TAGS, weights=weights, k=rng.randint(1, 3))))
    return found


def _rows(n: int, *, org_ids: list[str], key_ids: list[str], live: bool, created_ns: int,
          rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """A batch's row, its tag rows and its chunk row (None for a batch that settled nothing)."""
    owner = 0 if n % 10 == 0 else rng.randrange(1, len(org_ids))
    created = created_ns // 1_000_000_000
    batch = Batch(id=f"batch_y{n:09d}", org_id=org_ids[owner], key_id=key_ids[owner],
                  endpoint="/v1/chat/completions", input_file_id=f"file-y{n:09d}",
                  input_blob_key=f"files/file-y{n:09d}", completion_window="24h",
                  priority="expedited" if rng.random() < 0.05 else "standard", status=BatchStatus.VALIDATING,
                  model=rng.choices([m for m, _ in MODELS], weights=[w for _, w in MODELS])[0],
                  created_at=created, expires_at=created + DAY_SECONDS, total=rng.randint(1, 40),
                  metadata=_metadata(rng, n))
    row = batch_values(batch, created_ns)
    row.update(reserved_nano_usd=0, output_expires_seconds=None, in_progress_at=None, finalizing_at=None,
               completed_at=None, failed_at=None, expired_at=None, cancelling_at=None, cancelled_at=None,
               output_file_id=None, error_file_id=None, errors=None, lease_owner=None, lease_expires_at=None,
               run_failures=0, retry_at=None, throughput_window=None, concurrency_limit=None)
    tags = tag_rows(batch_id=batch.id, org_id=batch.org_id, created_ns=created_ns, metadata=batch.metadata)
    total = batch.total
    if live:
        state = rng.choices([s for s, _ in LIVE], weights=[w for _, w in LIVE])[0]
        if state == "validating":
            return row, tags, None
        row["status"] = {"queued": "in_progress", "running": "in_progress"}.get(state, state)
        if state == "queued":
            return row, tags, None
        done = rng.randint(0, total)
        row.update(started=True, in_progress_at=created + 5, lease_owner=_HOLDER, lease_expires_at=4e9,
                   **({"finalizing_at": created + 60} if state == "finalizing" else {}),
                   **({"cancelling_at": created + 60} if state == "cancelling" else {}))
    else:
        status = rng.choices([s for s, _ in ENDED], weights=[w for _, w in ENDED])[0]
        done = total if status is not BatchStatus.EXPIRED else rng.randint(0, total)
        ended = created + rng.randint(30, 3_600)
        row.update(status=status.value, started=True, in_progress_at=created + 5, **{f"{status.value}_at": ended})
        if status is not BatchStatus.FAILED:
            row.update(finalizing_at=ended - 1, output_file_id=f"file-o{n:09d}")
        if status is BatchStatus.CANCELLED:
            row["cancelling_at"] = ended - 10
    failed = rng.randint(0, done // 10) if done else 0
    tokens = done * rng.randint(200, 2_000)
    row.update(completed=done - failed, failed=failed if live else total - (done - failed), input_tokens=tokens,
               output_tokens=tokens // 3, cost_nano_usd=tokens * 150)
    if failed and not live:
        row["error_file_id"] = f"file-e{n:09d}"
    if not done:
        return row, tags, None
    chunk = {"batch_id": batch.id, "seq": 0, "out_key": f"batches/{batch.id}/chunks/0.out",
             "err_key": f"batches/{batch.id}/chunks/0.err" if failed else None,
             "lines": orjson.dumps(list(range(1, done + 1))).decode(), "completed": done - failed,
             "failed": failed, "input_tokens": tokens, "output_tokens": tokens // 3, "cost_nano_usd": tokens * 150,
             "created_at": created + 20, "out_bytes": 700 * done, "err_bytes": 300 * failed if failed else None,
             "cached_tokens": 0, "reasoning_tokens": 0}
    return row, tags, chunk


def _blocks(count: int, live: int, org_ids: list[str], key_ids: list[str],
            rng: random.Random) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]]:
    """The batches in order of creation: ``count - live`` ended over the year up to yesterday, then ``live``
    created over the last three hours."""
    now_ns = time.time_ns()
    ended = count - live
    year_start = now_ns - 365 * DAY_SECONDS * 1_000_000_000
    ended_step = (364 * DAY_SECONDS * 1_000_000_000) // max(ended, 1)
    for start in range(0, count, _BLOCK):
        rows, tags, chunks = [], [], []
        for n in range(start, min(start + _BLOCK, count)):
            is_live = n >= ended
            created_ns = (now_ns - 3 * 3_600_000_000_000 + (n - ended) * (3 * 3_600_000_000_000 // max(live, 1))
                          if is_live else year_start + n * ended_step + rng.randrange(ended_step))
            row, tag_list, chunk = _rows(n, org_ids=org_ids, key_ids=key_ids, live=is_live, created_ns=created_ns,
                                         rng=rng)
            rows.append(row)
            tags += tag_list
            if chunk is not None:
                chunks.append(chunk)
        yield rows, tags, chunks


def _copy(db: Database, table: sa.Table, rows: list[dict[str, Any]], cursor: Any) -> None:
    """PostgreSQL: the rows by COPY, in the table's column order."""
    names = [c.name for c in table.columns]
    with cursor.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([row[name] for name in names])


def seed(url: str, *, count: int, orgs: int, live: int, rng_seed: int = 24, say: Any = print) -> Seeded:
    """Fill the (empty) store at ``url``; returns the measured organization and a key of it."""
    began = time.perf_counter()
    db = Database(url)
    db.migrate()
    accounts = Accounts(db)
    org_ids, key_ids, secret = [], [], ""
    for i in range(orgs):
        org = accounts.create_org(f"year-org-{i:04d}")
        key, made = accounts.create_key(org.id)
        org_ids.append(org.id)
        key_ids.append(key.id)
        secret = secret or made
    rng = random.Random(rng_seed)
    written = 0
    for rows, tags, chunks in _blocks(count, live, org_ids, key_ids, rng):
        if db.is_sqlite:
            with db.write() as conn:
                for table, found in ((batches, rows), (batch_tags, tags), (batch_chunks, chunks)):
                    if found:
                        conn.execute(table.insert(), found)
                count_ended(conn, [row["id"] for row in rows], sign=1)
        else:
            raw = db.engine.raw_connection()
            try:
                with raw.cursor() as cursor:
                    for table, found in ((batches, rows), (batch_tags, tags), (batch_chunks, chunks)):
                        _copy(db, table, found, cursor)
                raw.commit()
            finally:
                raw.close()
            with db.write() as conn:
                count_ended(conn, [row["id"] for row in rows], sign=1)
        written += len(rows)
        if written % 200_000 < _BLOCK:
            say(f"  {written:,} batches written ({time.perf_counter() - began:.0f} s)")
    if not db.is_sqlite:
        with db.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    with db.read() as conn:
        mine = conn.execute(sa.select(sa.func.count()).where(batches.c.org_id == org_ids[0])).scalar_one()
    db.dispose()
    return Seeded(org_id=org_ids[0], secret=secret, batches=mine, seconds=time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", required=True, help="an empty store (a new SQLite file, a new database)")
    parser.add_argument("--batches", type=int, default=1_000_000)
    parser.add_argument("--orgs", type=int, default=1_000)
    parser.add_argument("--live", type=int, default=200, help="batches not ended (queued, running, ...)")
    args = parser.parse_args()
    made = seed(args.database_url, count=args.batches, orgs=args.orgs, live=args.live)
    print(f"{args.batches:,} batches of {args.orgs:,} organizations in {made.seconds:.0f} s; {MAIN_ORG} holds "
          f"{made.batches:,}; its key: {made.secret}")


if __name__ == "__main__":
    main()
