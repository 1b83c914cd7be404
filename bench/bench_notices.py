"""What the change notices of the read cache cost writers on PostgreSQL (migrations 0010 and 0015's triggers).

    .venv/bin/python bench/bench_notices.py [--connections 8 32] [--orgs 1] [--updates 1500] [--rounds 2]

On a fresh database of the test PostgreSQL server (``OPENRELAY_TEST_PG``, dropped afterwards), with one session
LISTENing as an API process's would: ``--connections`` connections each commit ``--updates`` one-row updates of
their own batch (autocommit, ``synchronous_commit`` on), the batches spread over ``--orgs`` organizations, each
round in three modes: notices coalesced (``openrelay.notice_seconds`` at its default, 0.1 s), a notice at every
commit (``notice_seconds`` 0, as before migration 0015) and the trigger disabled. Two kinds of update: one a poll
can see (``completed = completed + 1``, as a chunk's commit does), which notifies, and a lease renewal (a
heartbeat), which the trigger's ``WHEN`` skips. Prints commits/s of each, and the notices the listener heard.
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
from openrelay.store.notices import SPACING_SETTING  # noqa: E402
from tests.support.server import create_pg_database, drop_pg_database  # noqa: E402

UPDATES = {
    "a change a poll sees (notifies)": "UPDATE batches SET completed = completed + 1 WHERE id = %s",
    "a lease renewal (skipped by WHEN)": "UPDATE batches SET lease_expires_at = extract(epoch FROM now()) "
                                         "WHERE id = %s",
}


MODES = {  # mode: (the triggers enabled, openrelay.notice_seconds of the writers' sessions)
    "coalesced": (True, None),
    "every commit": (True, "0"),
    "trigger disabled": (False, None),
}


def commits_per_second(url: str, sql: str, connections: int, updates: int, notice_seconds: str | None) -> float:
    def work(i: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            if notice_seconds is not None:
                conn.execute(f"SET {SPACING_SETTING} = '{notice_seconds}'")
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
    parser.add_argument("--connections", type=int, nargs="+", default=[8])
    parser.add_argument("--orgs", type=int, default=1, help="organizations the batches are spread over")
    parser.add_argument("--updates", type=int, default=1500, help="commits per connection and case")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    url = create_pg_database()
    try:
        db = Database(url)
        db.migrate()
        accounts = Accounts(db)
        orgs = [accounts.create_org(f"bench-{n}") for n in range(args.orgs)]
        keys = [accounts.create_key(org.id)[0] for org in orgs]
        db.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(max(args.connections)):
                org, key = orgs[i % args.orgs], keys[i % args.orgs]
                conn.execute(
                    "INSERT INTO batches (id, org_id, key_id, endpoint, input_file_id, input_blob_key, "
                    "completion_window, priority, status, model, created_at, created_ns, expires_at, total, "
                    "completed, failed, rejected_count, input_tokens, output_tokens, cost_nano_usd, started, "
                    "run_failures) VALUES (%s, %s, %s, '/v1/chat/completions', 'f', 'k', '24h', 'standard', "
                    "'in_progress', 'm', 0, %s, 0, 10, 0, 0, 0, 0, 0, 0, false, 0)", (f"bench-{i}", org.id, key.id, i))
        with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as admin:
            listener.execute("LISTEN openrelay_batches")
            for n in range(1, args.rounds + 1):
                for connections in args.connections:
                    for mode, (enabled, notice_seconds) in MODES.items():
                        admin.execute(f"ALTER TABLE batches {'ENABLE' if enabled else 'DISABLE'} TRIGGER USER")
                        for label, sql in UPDATES.items():
                            rate = commits_per_second(url, sql, connections, args.updates, notice_seconds)
                            heard = 0
                            while got := sum(1 for _ in listener.notifies(timeout=0.5)):
                                heard += got
                            print(f"round {n}, {connections} connections, {mode}: {label}: {rate:,.0f} commits/s "
                                  f"({heard} notices heard)", flush=True)
    finally:
        drop_pg_database(url)


if __name__ == "__main__":
    main()
