"""Webhooks: how long the workers' pruning of the delivery log takes (``WebhookOutbox``'s log, store/webhook_log.py).

    .venv/bin/python bench/bench_webhook_prune.py [--events 20000] [--attempts 3] [--postgres]

On a fresh store (SQLite in a temp dir, or a fresh database on ``OPENRELAY_TEST_PG``): ``--events`` delivered events
of one endpoint, each with ``--attempts`` attempts, written two days ago, and as many written now. Times one prune
with a one-day age (deletes the old half) and the next one (nothing left to delete: what every hourly prune costs
on a log with nothing past its age). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.clock import now  # noqa: E402
from openrelay.ids import new_event_id, new_webhook_attempt_id  # noqa: E402
from openrelay.store.accounts import Accounts  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from openrelay.store.schema import webhook_attempts, webhook_deliveries, webhook_events  # noqa: E402
from tests.support.server import create_pg_database, drop_pg_database  # noqa: E402
from tests.support.webhook_loops import WebhookStores  # noqa: E402

_DAY = 86_400.0


def fill(db: Database, store: WebhookStores, org_id: str, endpoint_id: str, events: int, attempts: int,
         at: float) -> None:
    for start in range(0, events, 1000):
        rows = [new_event_id() for _ in range(min(1000, events - start))]
        with db.write() as conn:
            conn.execute(webhook_events.insert(), [
                {"id": e, "org_id": org_id, "type": "batch.completed", "created_at": int(at), "payload": "{}"}
                for e in rows])
            conn.execute(webhook_deliveries.insert(), [
                {"id": f"whd_{e[4:]}{endpoint_id[3:]}", "event_id": e, "endpoint_id": endpoint_id, "org_id": org_id,
                 "state": "delivered", "attempts": attempts, "enqueued_at": at, "next_attempt_at": at,
                 "last_attempt_at": at, "delivered_at": at, "created_at": at} for e in rows])
            conn.execute(webhook_attempts.insert(), [
                {"id": new_webhook_attempt_id(), "event_id": e, "endpoint_id": endpoint_id, "org_id": org_id,
                 "attempt": n, "attempted_at": at, "outcome": "delivered", "status_code": 200, "duration_ms": 1}
                for e in rows for n in range(1, attempts + 1)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = create_pg_database() if args.postgres else f"sqlite:///{tmp}/prune.db"
        db = Database(url)
        try:
            db.migrate()
            org = Accounts(db).create_org("bench")
            store = WebhookStores.of(db)
            endpoint = store.endpoints.add_endpoint(org.id, "https://hooks.example.com/", "whsec_AAAA", limit=16)
            assert endpoint is not None
            fill(db, store, org.id, endpoint.id, args.events, args.attempts, now() - 2 * _DAY)
            fill(db, store, org.id, endpoint.id, args.events, args.attempts, float(now()))
            started = time.perf_counter()
            pruned = store.log.prune_delivery_log(older_than=_DAY)
            first = time.perf_counter() - started
            started = time.perf_counter()
            again = store.log.prune_delivery_log(older_than=_DAY)
            second = time.perf_counter() - started
            print(json.dumps({"store": "postgresql" if args.postgres else "sqlite", "events_old": args.events,
                              "events_new": args.events, "attempts_per_event": args.attempts,
                              "pruned": vars(pruned), "prune_seconds": round(first, 3),
                              "nothing_to_prune_ms": round(second * 1000, 2), "pruned_again": vars(again)}))
        finally:
            db.dispose()
            if args.postgres:
                drop_pg_database(url)


if __name__ == "__main__":
    main()
