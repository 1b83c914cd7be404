"""What the change notices of the read cache cost writers on PostgreSQL (migration 0010's trigger).

    .venv/bin/python bench/bench_notices.py [--connections 8] [--updates 1500] [--rounds 2]

On a fresh database of the test PostgreSQL server (``OPENRELAY_TEST_PG``, dropped afterwards), with one session
LISTENing as an API process's would: ``--connections`` connections each commit ``--updates`` one-row updates of
their own batch (autocommit, ``synchronous_commit`` on), first with the trigger, then with it disabled, each
round. Two kinds of update: one a poll can see (``completed = completed + 1``, as a chunk's commit does), which
notifies, and a lease renewal (a heartbeat), which the trigger's ``WHEN`` skips. Prints commits/s of each.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.store.accounts import Accounts  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from tests.support.server import create_pg_database, drop_pg_database  # noqa: E402

UPDATES = {
    "a change a poll sees (notifies)": "UPDATE batches SET completed = completed + 1 WHERE id = %s",
    "a lease renewal (skipped by WHEN)": "UPDATE batches SET lease_expires_at = extract(epoch FROM now()) "
                                         "WHERE id = %s",
}


def commits_per_second(url: str, sql: str, connections: int, updates: int) -> float:
    def work(i: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(updates):
                conn.execute(sql, (f"bench-{i}",))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(connections)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return connections * updates / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--updates", type=int, default=1500, help="commits per connection and case")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    url = create_pg_database()
    try:
        db = Database(url)
        db.migrate()
        accounts = Accounts(db)
        org = accounts.create_org("bench")
        key, _secret = accounts.create_key(org.id)
        db.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(args.connections):
                conn.execute(
                    "INSERT INTO batches (id, org_id, key_id, endpoint, input_file_id, input_blob_key, "
                    "completion_window, priority, status, model, created_at, created_ns, expires_at, total, "
                    "completed, failed, rejected_count, input_tokens, output_tokens, cost_nano_usd, started, "
                    "run_failures) VALUES (%s, %s, %s, '/v1/chat/completions', 'f', 'k', '24h', 'standard', "
                    "'in_progress', 'm', 0, %s, 0, 10, 0, 0, 0, 0, 0, 0, false, 0)", (f"bench-{i}", org.id, key.id, i))
        with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as admin:
            listener.execute("LISTEN openrelay_batches")
            for n in range(1, args.rounds + 1):
                for trigger in ("ENABLE", "DISABLE"):
                    admin.execute(f"ALTER TABLE batches {trigger} TRIGGER USER")
                    for label, sql in UPDATES.items():
                        rate = commits_per_second(url, sql, args.connections, args.updates)
                        print(f"round {n}, trigger {trigger.lower()}d: {label}: {rate:,.0f} commits/s")
                    for _ in listener.notifies(timeout=0.5):
                        pass  # let the queue go
    finally:
        drop_pg_database(url)


if __name__ == "__main__":
    main()
