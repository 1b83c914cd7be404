"""Benchmark for issue 24 part 3 (a store a year old): the cost of each read at 1,000 and at 1,000,000 batches,
measured in one run.

    .venv/bin/python bench/bench_year_store.py [--store sqlite|postgres|both] [--small 1000] [--big 1000000]
                                               [--requests 100] [--keep] [--plans]

Seeds two stores of each kind with ``bench/seed_store.py`` (the same 1,000 organizations; the measured one holds
one batch in ten, so 100,000 in the big store; the same 200 batches not ended in both), starts a real
``orl serve --no-worker`` on each, and times over HTTP, alternating one request to the small store and one to the
big one: ``GET /v1/batches/{id}`` (a different batch of the organization each time), list pages, and the
dashboard's Batch page (the whole page rendered: 25 rows and the summary) first and under each filter. A claim
(``BatchLeases.claim`` of a queued batch, the worker's one transaction) is timed in this process, and the batch
put back after each. Prints p50 and p95 in ms and the ratio of the big store's p95 to the small one's.

The SQLite files and PostgreSQL databases (``orl_year_<batches>``) are made, used and removed by the run; with
``--keep`` they stay (the files under ``--cache``), and a later run reuses them instead of seeding again.
``--drop`` removes the kept stores. ``--plans``: the query plans of a claim, a list page and the summary on the
big store.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.seed_store import MAIN_ORG, MODELS, SEARCHED, seed  # noqa: E402
from openrelay.service import batches as batch_service  # noqa: E402
from openrelay.service import dashboard  # noqa: E402
from openrelay.store.batches import Batches  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from openrelay.store.leases import BatchLeases  # noqa: E402
from openrelay.store.schema import batches  # noqa: E402
from openrelay.types import ALL_SCOPES, ApiKey, BatchStatus  # noqa: E402
from tests.support.server import PG_ADMIN_URL, Server, free_port  # noqa: E402

CATALOG = "".join(f"""
[[models]]
name = "{model}"
endpoints = ["/v1/chat/completions"]
slots = 1000
concurrency = 4
engine = {{ kind = "openai", base_url = "http://127.0.0.1:9/v1", served_model = "x" }}
""" for model, _ in MODELS)


def _week() -> tuple[str, str]:
    today = datetime.now(UTC).date()
    return (today - timedelta(days=7)).isoformat(), today.isoformat()


# name, path (the API's under /v1, the dashboard's from the root), params; "{id}": a batch of the organization
CASES: tuple[tuple[str, str, list[tuple[str, str]]], ...] = (
    ("GET /v1/batches/{id}", "/v1/batches/{id}", []),
    ("GET /v1/batches (first page)", "/v1/batches", []),
    ("GET /v1/batches?after= (second page)", "/v1/batches", [("after", "{page2}")]),
    ("GET /v1/batches?status=completed", "/v1/batches", [("status", "completed")]),
    ("GET /v1/batches?tag=nightly", "/v1/batches", [("tag", "nightly")]),
    ("Batch page (first render)", "/", []),
    ("Batch page status=completed", "/", [("status", "completed")]),
    ("Batch page status=queued", "/", [("status", "queued")]),
    ("Batch page status=running", "/", [("status", "running")]),
    ("Batch page model=qwen/qwen3-32b", "/", [("model", "qwen/qwen3-32b")]),
    ("Batch page priority=expedited", "/", [("priority", "expedited")]),
    ("Batch page tag=nightly", "/", [("tag", "nightly")]),
    ("Batch page tag=eval + status=failed", "/", [("tag", "eval"), ("status", "failed")]),
    ("Batch page last 7 days", "/", [("from", _week()[0]), ("to", _week()[1])]),
    (f"Batch page q={SEARCHED} (20 matches)", "/", [("q", SEARCHED)]),
    ("Batch page tag=nightly + tag=eval (matches)", "/", [("tag", "nightly"), ("tag", "eval")]),
    ("Batch page q=ab (under 3 characters: a scan)", "/", [("q", "ab")]),
)
# A case that scans the organization runs a tenth of --requests: seconds each at 100,000 batches.
SCANS = frozenset({"Batch page q=ab (under 3 characters: a scan)"})


class Store:
    """One seeded store, its server and its clients."""

    def __init__(self, kind: str, count: int, cache: Path, work: Path) -> None:
        self.kind, self.count = kind, count
        self.url = (f"sqlite:///{cache / f'year-{count}.db'}" if kind == "sqlite"
                    else PG_ADMIN_URL.rsplit("/", 1)[0] + f"/orl_year_{count}")
        self.marker = cache / f"year-{kind}-{count}.json"
        self.work = work / f"{kind}-{count}"
        self.work.mkdir(parents=True, exist_ok=True)

    def ensure(self) -> None:
        if self.marker.exists():
            self.seeded = json.loads(self.marker.read_text())
            print(f"{self.kind} {self.count:,}: reusing the store seeded before ({self.url})")
            return
        self.drop()
        if self.kind == "postgres":
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "orl_year_{self.count}"')
        print(f"{self.kind} {self.count:,}: seeding")
        made = seed(self.url, count=self.count, orgs=1_000, live=200, say=lambda line: print(line, flush=True))
        self.seeded = {"org_id": made.org_id, "secret": made.secret, "batches": made.batches,
                       "seconds": round(made.seconds)}
        self.marker.write_text(json.dumps(self.seeded))
        print(f"{self.kind} {self.count:,}: seeded in {made.seconds:.0f} s, {MAIN_ORG} holds {made.batches:,}")

    def size(self) -> str:
        if self.kind == "sqlite":
            path = Path(self.url.removeprefix("sqlite:///"))
            total = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        else:
            with psycopg.connect(PG_ADMIN_URL) as conn:
                total = conn.execute(f"SELECT pg_database_size('orl_year_{self.count}')").fetchone()[0]
        return f"{total / 2**20:,.0f} MiB"

    def drop(self) -> None:
        self.marker.unlink(missing_ok=True)
        if self.kind == "sqlite":
            path = Path(self.url.removeprefix("sqlite:///"))
            for found in path.parent.glob(path.name + "*"):
                found.unlink()
        else:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "orl_year_{self.count}" WITH (FORCE)')

    def start(self) -> None:
        catalog = self.work / "catalog.toml"
        catalog.write_text(CATALOG)
        self.server = Server(data_dir=self.work, database_url=self.url, port=free_port(),
                             args=["--catalog", str(catalog), "--no-worker"], env={}).start()
        root = self.server.base_url.removesuffix("/v1")
        self.http = httpx.Client(base_url=root, headers={"authorization": f"Bearer {self.seeded['secret']}"},
                                 timeout=120)
        form = self.http.get("/login")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert token is not None
        assert self.http.post("/login", data={"csrf": token.group(1), "api_key": self.seeded["secret"]}
                              ).status_code in (302, 303)
        self.db = Database(self.url)
        with self.db.read() as conn:
            ids = list(conn.execute(sa.select(batches.c.id).where(batches.c.org_id == self.seeded["org_id"])
                                    .order_by(batches.c.created_ns.desc()).limit(5_000)).scalars())
        self.page2 = ids[19]
        self.ids = itertools.cycle(ids[::max(1, len(ids) // 200)])

    def get(self, path: str, params: list[tuple[str, str]]) -> None:
        path = path.replace("{id}", next(self.ids))
        params = [(k, v.replace("{page2}", self.page2)) for k, v in params]
        answer = self.http.get(path, params=params)
        assert answer.status_code == 200, (path, params, answer.status_code, answer.text[:300])

    def claim(self) -> None:
        """One claim of a queued batch (timed), then the batch put back as it was (not timed)."""
        leases = BatchLeases(self.db)
        began = time.perf_counter()
        claimed = leases.claim("bench-claimer", {m: 1000 for m, _ in MODELS}, 60.0)
        took = time.perf_counter() - began
        assert claimed is not None and claimed.status is BatchStatus.IN_PROGRESS, claimed
        with self.db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == claimed.id).values(
                lease_owner=None, lease_expires_at=None, started=False))
        self.claim_took = took

    def stop(self) -> None:
        self.http.close()
        self.server.stop()
        self.db.dispose()


def _p(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[94]


def _alternate(small: Callable[[], float], big: Callable[[], float], requests: int) -> tuple[list[float], list[float]]:
    for _ in range(3):
        small(), big()
    a, b = [], []
    for _ in range(requests):
        a.append(small())
        b.append(big())
    return a, b


def _timed(call: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        began = time.perf_counter()
        call()
        return (time.perf_counter() - began) * 1000
    return run


def _claim_timer(store: Store) -> Callable[[], float]:
    def run() -> float:
        store.claim()
        return store.claim_took * 1000
    return run


def plans(store: Store) -> None:
    """EXPLAIN of the statements a claim, a list page and the summary run (big store)."""
    statements: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith(("SELECT", "UPDATE")):
            statements.append((statement, parameters))

    key = ApiKey(id="k", org_id=store.seeded["org_id"], prefix="", scopes=frozenset(ALL_SCOPES), budget_nano_usd=None,
                 spent_nano_usd=0, created_at=0, revoked_at=None)
    sa.event.listen(store.db.engine, "before_cursor_execute", capture)
    try:
        store.claim()
        batch_service.list_batches(Batches(store.db), key, limit=20, after=None, status=None, model=None, tag=None)
        dashboard.list_batch_page(store.db, key, dashboard.BatchQuery())
        dashboard.list_batch_page(store.db, key, dashboard.BatchQuery(text=SEARCHED))
    finally:
        sa.event.remove(store.db.engine, "before_cursor_execute", capture)
    raw = store.db.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for sql, args in statements:
            prefix = "EXPLAIN QUERY PLAN " if store.kind == "sqlite" else "EXPLAIN (COSTS OFF) "
            cursor.execute(prefix + sql, args)
            lines = [" ".join(str(c) for c in row[-1:]) for row in cursor.fetchall()]
            print("   ", " ".join(sql.split())[:150] + "\n        " + "\n        ".join(lines))
        raw.rollback()
    finally:
        raw.close()


def measure(kind: str, args: argparse.Namespace, work: Path) -> None:
    small, big = Store(kind, args.small, args.cache, work), Store(kind, args.big, args.cache, work)
    try:
        for store in (small, big):
            store.ensure()
        sizes = f"{small.size()} and {big.size()}"
        for store in (small, big):
            store.start()
        if args.plans:
            print(f"\n## plans, {kind}, {args.big:,} batches")
            plans(big)
        rows = []
        for name, path, params in CASES:
            requests = max(5, args.requests // 10) if name in SCANS else args.requests
            a, b = _alternate(_timed(lambda p=path, q=params: small.get(p, q)),
                              _timed(lambda p=path, q=params: big.get(p, q)), requests)
            rows.append((name, _p(a), _p(b)))
        a, b = _alternate(_claim_timer(small), _claim_timer(big), args.requests)
        rows.append(("claim (in-process, one transaction)", _p(a), _p(b)))
        with open("/proc/loadavg") as handle:
            load = " ".join(handle.read().split()[:3])
        print(f"\n{kind}: {args.small:,} vs {args.big:,} batches ({small.seeded['batches']:,} vs "
              f"{big.seeded['batches']:,} of the measured organization; stores of {sizes}); {args.requests} "
              f"requests each, alternating; load average after: {load}")
        print(f"| read | p50 / p95 at {args.small:,} (ms) | p50 / p95 at {args.big:,} (ms) | p95 ratio |")
        print("| --- | --- | --- | --- |")
        for name, (a50, a95), (b50, b95) in rows:
            print(f"| {name} | {a50:.1f} / {a95:.1f} | {b50:.1f} / {b95:.1f} | {b95 / a95:.2f} |")
    finally:
        for store in (small, big):
            if hasattr(store, "server"):
                store.stop()
            if not args.keep:
                store.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/orl-year-store"))
    parser.add_argument("--keep", action="store_true", help="keep the seeded stores for the next run")
    parser.add_argument("--plans", action="store_true")
    parser.add_argument("--drop", action="store_true", help="remove the stores kept by --keep, and measure nothing")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    kinds = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    if args.drop:
        for kind in kinds:
            for count in (args.small, args.big):
                store = Store(kind, count, args.cache, args.cache / "dropping")
                print(f"{kind} {count:,}: {store.size() if store.marker.exists() else 'not kept'}; dropped")
                store.drop()
        shutil.rmtree(args.cache / "dropping", ignore_errors=True)
        return
    work = args.cache / f"run-{time.time_ns()}"
    try:
        for kind in kinds:
            measure(kind, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
