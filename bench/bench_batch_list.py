"""Benchmark for issue 12 (Speed): the list of an organization with 10,000 batches, unfiltered and under each
filter, through the API and the dashboard.

    .venv/bin/python bench/bench_batch_list.py [--batches 10000] [--noise 5000] [--requests 200]
                                               [--postgres | --database-url URL] [--plans]

Fills a fresh store (SQLite in a temporary directory; ``--postgres``: a fresh database on the test PostgreSQL
server, ``OPENRELAY_TEST_PG``, dropped afterwards) through ``Batches.create`` (so tags get their rows as a real
create writes them) with ``--batches`` batches for one organization and ``--noise`` for each of two others, with
realistic metadata (a job name, an owner, 0 to 4 tags drawn from 40 with a skew, a fifth of batches without
tags), five models with a skew, and statuses spread as a busy organization's are (most completed; some failed,
cancelled, expired; a few hundred queued and running). Statuses and times are set by SQL after the creates: no
worker runs; the ended ones are then counted for the summary (``ended_counts.count_ended``) as a terminal
transaction counts them. On PostgreSQL the tables are ANALYZEd after the fill (autovacuum would do it); SQLite is
left as a real store is, without ANALYZE.

Then, per case, ``--requests`` timings of:
- ``api``: ``service.batches.list_batches`` (a page of 20, as ``GET /v1/batches``) and its JSON, in-process;
- ``dash``: ``service.dashboard.list_batch_page`` (a page of 25 and the summary of the filtered set: what the
  Batch page renders), in-process;
- ``http api`` / ``http dash``: ``GET /v1/batches?...`` and ``GET /?...`` (the whole page rendered) against a real
  ``orl serve --no-worker`` on the same store, timed at the client over loopback on one keep-alive connection.
p50 and p95 in milliseconds. ``--plans`` prints each case's query plans (EXPLAIN QUERY PLAN / EXPLAIN ANALYZE).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.config import Settings  # noqa: E402
from openrelay.runtime import Runtime, open_runtime  # noqa: E402
from openrelay.service import batches as batch_service  # noqa: E402
from openrelay.service import dashboard  # noqa: E402
from openrelay.store.batches import _list_query  # noqa: E402
from openrelay.store.ended_counts import count_ended  # noqa: E402
from openrelay.store.schema import batches  # noqa: E402
from openrelay.types import TERMINAL_VALUES, ApiKey, Batch, BatchStatus  # noqa: E402
from tests.support.server import Server, create_pg_database, drop_pg_database, free_port  # noqa: E402

CATALOG = """
[[models]]
name = "{model}"
endpoints = ["/v1/chat/completions"]
slots = 1
concurrency = 4
engine = {{ kind = "openai", base_url = "http://127.0.0.1:9/v1", served_model = "x" }}
"""

MODELS = (("meta/llama-3.1-8b", 50), ("qwen/qwen3-32b", 25), ("mistral/small-3.1", 15), ("google/gemma-3-27b", 8),
          ("bench/rare", 2))
TAGS = ("nightly", "eval", "prod", "staging", "team-search", "team-ads", "team-ml", "backfill", "weekly", "eu",
        "us", "apac", "priority", "experiment", "ab-test", "cohort-a", "cohort-b", "reindex", "summaries",
        "embeddings", "classify", "translate", "moderation", "retry", "v1", "v2", "v3", "customer-42",
        "customer-77", "customer-91", "holiday", "launch", "pilot", "qa", "smoke", "load", "migration", "archive",
        "legal", "rare-tag")
# (status, in_progress_at set, share)
STATUSES = ((BatchStatus.COMPLETED, True, 70.0), (BatchStatus.FAILED, False, 8.0), (BatchStatus.CANCELLED, True, 6.0),
            (BatchStatus.EXPIRED, True, 4.0), (BatchStatus.IN_PROGRESS, True, 5.0),
            (BatchStatus.IN_PROGRESS, False, 6.0), (BatchStatus.FINALIZING, True, 0.5),
            (BatchStatus.VALIDATING, False, 0.5))


def _metadata(rng: random.Random, n: int) -> dict[str, str]:
    found = {"job": f"job-{n % 300}", "owner": rng.choice(("ana", "bo", "chen", "dara", "eli"))}
    if rng.random() >= 0.2:
        weights = [1.0 / (i + 1) for i in range(len(TAGS) - 1)] + [0.01]
        found["tags"] = ", ".join(dict.fromkeys(rng.choices(TAGS, weights=weights, k=rng.randint(1, 4))))
    return found


def fill(rt: Runtime, org_id: str, key_id: str, count: int, rng: random.Random, start_ns: int) -> None:
    """``count`` batches made by ``Batches.create``, then their statuses, times and usage set by SQL."""
    models = [m for m, _ in MODELS]
    model_weights = [w for _, w in MODELS]
    made: list[tuple[str, int]] = []
    for n in range(count):
        created_ns = start_ns + n * 1_000_000_000 + rng.randrange(1_000_000)
        batch = Batch(id=f"batch_{org_id[-6:]}{n:08d}", org_id=org_id, key_id=key_id,
                      endpoint="/v1/chat/completions", input_file_id=f"file-{n}", input_blob_key=f"in/{n}",
                      completion_window="24h", priority="expedited" if n % 10 == 0 else "standard",
                      status=BatchStatus.VALIDATING, model=rng.choices(models, weights=model_weights)[0],
                      created_at=created_ns // 1_000_000_000, expires_at=created_ns // 1_000_000_000 + 86_400,
                      total=rng.randint(1, 50_000), metadata=_metadata(rng, n))
        rt.batches.create(batch, created_ns, [])
        made.append((batch.id, batch.created_at))
    shares = [s for _, _, s in STATUSES]
    updates: list[dict[str, Any]] = []
    for batch_id, created_at in made:
        status, started, _ = rng.choices(STATUSES, weights=shares)[0]
        tokens = rng.randint(1_000, 5_000_000)
        updates.append({"b_id": batch_id, "status": status.value,
                        "in_progress_at": created_at + rng.randint(1, 600) if started else None,
                        "input_tokens": tokens, "output_tokens": tokens // 3, "cost_nano_usd": tokens * 300})
    with rt.db.write() as conn:
        conn.execute(batches.update().where(batches.c.id == sa.bindparam("b_id")).values(
            status=sa.bindparam("status"), in_progress_at=sa.bindparam("in_progress_at"),
            input_tokens=sa.bindparam("input_tokens"), output_tokens=sa.bindparam("output_tokens"),
            cost_nano_usd=sa.bindparam("cost_nano_usd")), updates)
        # As the terminal transactions do: the ended ones join the summary's counters (store/ended_counts.py).
        ended = [u["b_id"] for u in updates if u["status"] in TERMINAL_VALUES]
        for start in range(0, len(ended), 500):
            count_ended(conn, ended[start:start + 500], sign=1)


def percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[94]


def timed(call: Callable[[], Any], requests: int) -> tuple[float, float]:
    for _ in range(5):
        call()
    samples = []
    for _ in range(requests):
        began = time.perf_counter()
        call()
        samples.append((time.perf_counter() - began) * 1000)
    return percentiles(samples)


# name, API filters (None: the API has no such filter), dashboard filters
CASES: tuple[tuple[str, dict[str, str] | None, dict[str, Any]], ...] = (
    ("first page", {}, {}),
    ("tag (common: nightly)", {"tag": "nightly"}, {"tags": ("nightly",)}),
    ("tag (rare: rare-tag)", {"tag": "rare-tag"}, {"tags": ("rare-tag",)}),
    ("two tags (nightly + eval)", None, {"tags": ("nightly", "eval")}),
    ("two tags (eval + rare-tag)", None, {"tags": ("eval", "rare-tag")}),
    ("status completed", {"status": "completed"}, {"status": "completed"}),
    ("status failed", {"status": "failed"}, {"status": "failed"}),
    ("queued", None, {"status": "queued"}),
    ("running", None, {"status": "running"}),
    ("model (common)", {"model": MODELS[0][0]}, {"model": MODELS[0][0]}),
    ("model (rare)", {"model": "bench/rare"}, {"model": "bench/rare"}),
    ("tag + status", {"tag": "eval", "status": "failed"}, {"tags": ("eval",), "status": "failed"}),
)


def _dash_params(filters: dict[str, Any]) -> list[tuple[str, str]]:
    params = [("tag", t) for t in filters.get("tags", ())]
    params += [(k, v) for k, v in filters.items() if k != "tags"]
    return params


def explain(rt: Runtime, api: dict[str, str] | None, dash: dict[str, Any], key: ApiKey) -> list[str]:
    """The plans of the statements one API call and one dashboard call run."""
    db = rt.db
    statements: list[tuple[str, Any]] = []
    if api is not None:
        query = _list_query(status="status" in api, model="model" in api, tag="tag" in api, after=False)
        sql, args = query.sql_and_args(db.engine.dialect, {"org_id": key.org_id, "rows": 21, **api})
        statements.append((sql, args))

    def capture(_conn, _cursor, statement, parameters, _context, _many):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    sa.event.listen(db.engine, "before_cursor_execute", capture)
    try:
        dashboard.list_batch_page(rt.db, key, dashboard.BatchQuery(**dash))
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", capture)
    found = []
    raw = db.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for sql, args in statements:
            prefix = "EXPLAIN QUERY PLAN " if db.is_sqlite else "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "
            cursor.execute(prefix + sql, args)
            lines = [" ".join(str(c) for c in row[-1:]) for row in cursor.fetchall()]
            found.append(" ".join(sql.split())[:160] + "\n      " + "\n      ".join(lines))
        raw.rollback()
    finally:
        raw.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--noise", type=int, default=5_000, help="batches of each of two other organizations")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--database-url")
    parser.add_argument("--plans", action="store_true")
    parser.add_argument("--no-http", action="store_true", help="in-process timings only (no orl serve)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="orl-bench-list-"))
    made_pg = None
    url = args.database_url
    if args.postgres:
        url = made_pg = create_pg_database()
    url = url or f"sqlite:///{work / 'openrelay.db'}"
    catalog = work / "catalog.toml"
    catalog.write_text(CATALOG.format(model=MODELS[0][0]))
    server = None
    rt = open_runtime(Settings.build(data_dir=work, database_url=url, catalog_path=catalog))
    try:
        rng = random.Random(12)
        orgs = []
        for name in ("bench-main", "bench-noise-1", "bench-noise-2"):
            org = rt.accounts.create_org(name)
            key, secret = rt.accounts.create_key(org.id)
            orgs.append((org, key, secret))
        began = time.perf_counter()
        start_ns = time.time_ns() - (args.batches + args.noise) * 1_000_000_000
        fill(rt, orgs[1][0].id, orgs[1][1].id, args.noise, rng, start_ns)
        fill(rt, orgs[0][0].id, orgs[0][1].id, args.batches, rng, start_ns + 500_000_000)
        fill(rt, orgs[2][0].id, orgs[2][1].id, args.noise, rng, start_ns + 700_000_000)
        filled = time.perf_counter() - began
        if not rt.db.is_sqlite:
            with rt.db.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
        _org, key, secret = orgs[0]
        store = "SQLite" if rt.db.is_sqlite else "PostgreSQL"
        print(f"{store}: {args.batches} batches for one organization and {2 * args.noise} of two others, made by "
              f"Batches.create in {filled:.1f} s ({filled / (args.batches + 2 * args.noise) * 1e3:.2f} ms each)")

        if not args.no_http:
            server = Server(data_dir=work, database_url=url, port=free_port(),
                            args=["--catalog", str(catalog), "--no-worker"], env={}).start()
            api_http = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {secret}"},
                                    timeout=60)
            dash_http = httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=60)
            form = dash_http.get("/login")
            token = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert token is not None
            signed = dash_http.post("/login", data={"csrf": token.group(1), "api_key": secret})
            assert signed.status_code in (302, 303)

        rows = []
        for name, api, dash in CASES:
            query = dashboard.BatchQuery(**dash)
            page = dashboard.list_batch_page(rt.db, key, query)
            figures = {"rows": f"{page.summary.batches}"}
            if api is not None:
                def api_call(api: dict[str, str] = api) -> bytes:
                    return orjson.dumps(batch_service.list_batches(
                        rt.batches, key, limit=20, after=None, status=api.get("status"), model=api.get("model"),
                        tag=api.get("tag")))

                def api_over_http(api: dict[str, str] = api) -> None:
                    assert api_http.get("/batches", params=api).status_code == 200

                figures["api"] = timed(api_call, args.requests)
                if server is not None:
                    figures["http api"] = timed(api_over_http, args.requests)

            def dash_call(query: dashboard.BatchQuery = query) -> None:
                dashboard.list_batch_page(rt.db, key, query)

            def dash_over_http(dash: dict[str, Any] = dash) -> None:
                assert dash_http.get("/", params=_dash_params(dash)).status_code == 200

            figures["dash"] = timed(dash_call, args.requests)
            if server is not None:
                figures["http dash"] = timed(dash_over_http, args.requests)
            rows.append((name, figures))
            if args.plans:
                print(f"\n## {name}")
                for plan in explain(rt, api, dash, key):
                    print("   ", plan)
        if server is not None:
            api_http.close()
            dash_http.close()

        def cell(value: Any) -> str:
            return "–" if value is None else f"{value[0]:.2f} / {value[1]:.2f}"

        print(f"\n{store}, {args.requests} requests a case, p50 / p95 in ms")
        print("| case | matching batches | API in-process | API over HTTP | dashboard in-process | "
              "dashboard over HTTP |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, f in rows:
            print(f"| {name} | {f['rows']} | {cell(f.get('api'))} | {cell(f.get('http api'))} | "
                  f"{cell(f['dash'])} | {cell(f.get('http dash'))} |")
    finally:
        if server is not None:
            server.stop()
        rt.close()
        if made_pg:
            drop_pg_database(made_pg)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
