"""Benchmark for issue 23 part 4 (hard budgets): what a key's hard budget costs a create.

    .venv/bin/python bench/bench_hard_budgets.py [--records 1000,10000] [--repeats 5] [--threads 10]
                                                 [--creates 100] [--postgres]

Against a real ``orl serve --no-worker`` (SQLite in a temporary directory; ``--postgres``: a fresh database on the
test PostgreSQL server, dropped afterwards), for a key without the flag and one with ``--hard-budget`` (both with a
budget that never runs out):
- ``one create``: the time of an inline create of N small chat records (each ``max_tokens`` 100), p50 of
  ``--repeats``: the hard key's create reads its records once more to price their maximum, as a dry run does;
- ``parallel``: ``--threads`` threads making ``--creates`` one-record creates in all, creates per second: a hard
  key's creates take turns on its row for their reservation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.batches import chat, post_batch  # noqa: E402
from tests.support.server import Server, catalog_text, create_pg_database, drop_pg_database, free_port  # noqa: E402


def _create(server: Server, key: str, records: list[dict]) -> float:
    started = time.perf_counter()
    answer = post_batch(server, api_key=key, requests=records)
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", default="1000,10000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--creates", type=int, default=100)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-hard-"))
    url = create_pg_database() if args.postgres else f"sqlite:///{data_dir / 'openrelay.db'}"
    (data_dir / "catalog.toml").write_text(catalog_text("http://127.0.0.1:9/v1"))  # no worker: never called
    server = Server(data_dir=data_dir, database_url=url, port=free_port(), env={},
                    args=["--no-worker", "--catalog", str(data_dir / "catalog.toml")]).start()
    try:
        accounts = server.store_accounts()
        org = accounts.create_org("bench")
        made = {name: accounts.create_key(org.id, budget_nano_usd=10**18, hard_budget=hard)
                for name, hard in (("soft", False), ("hard", True))}
        keys = {name: secret for name, (_key, secret) in made.items()}
        print(f"store: {'PostgreSQL' if args.postgres else 'SQLite'}")
        for n in map(int, args.records.split(",")):
            records = [chat(f"r{i}", f"tell me about the number {i} in one sentence", max_tokens=100)
                       for i in range(n)]
            for name, key in keys.items():
                p50 = statistics.median(_create(server, key, records) for _ in range(args.repeats))
                print(f"one create of {n:>6} records, {name} key: p50 {p50 * 1000:8.1f} ms")
        for name, key in keys.items():
            started = time.perf_counter()
            with ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(lambda i, k=key: _create(server, k, [chat(f"p{i}", "hi", max_tokens=100)]),
                              range(args.creates)))
            rate = args.creates / (time.perf_counter() - started)
            print(f"parallel: {args.creates} creates on {args.threads} threads, {name} key: {rate:7.1f} creates/s")
        reserved = accounts.key(made["hard"][0].id).reserved_nano_usd
        print(f"hard key's reservation afterwards (no worker ran): {reserved} nano-USD")
    finally:
        server.stop()
        if args.postgres:
            drop_pg_database(url)


if __name__ == "__main__":
    main()
