"""Webhooks: what the outbox adds to a batch's finalizing, and how fast one delivery loop drains it.

    .venv/bin/python bench/bench_webhooks.py [--batches 500] [--endpoints 1] [--postgres]

On a fresh store (SQLite in a temp dir, or a fresh database on ``OPENRELAY_TEST_PG``): finalizes ``--batches``
leased batches of an organization without endpoints, then as many of one with ``--endpoints`` endpoints (the
finalizing then also writes the event and a delivery per endpoint; an organization without endpoints writes the event
only), p50/p95 of each finalizing; then one ``WebhookDelivery`` drains the outbox round after round (``deliver_due``,
32 concurrent posts a round) into the receiver process of the tests, answering 200 at once: deliveries per
second, every one received once. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.catalog import parse_catalog  # noqa: E402
from openrelay.config import Settings  # noqa: E402
from openrelay.ids import new_batch_id, now, now_ns  # noqa: E402
from openrelay.store.accounts import Accounts  # noqa: E402
from openrelay.store.batches import Batches  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from openrelay.store.leases import BatchLeases  # noqa: E402
from openrelay.store.results import Results  # noqa: E402
from openrelay.store.webhooks import WebhookStore  # noqa: E402
from openrelay.types import Batch, BatchStatus  # noqa: E402
from openrelay.webhooks.delivery import WebhookDelivery  # noqa: E402
from tests.support.server import create_pg_database, drop_pg_database  # noqa: E402
from tests.support.webhook_receiver import running_receiver  # noqa: E402


def finalize_times(db: Database, org_id: str, key_id: str, count: int) -> list[float]:
    batches, results, taken = Batches(db), Results(db), []
    for _ in range(count):
        batch_id, created = new_batch_id(), now()
        batches.create(Batch(id=batch_id, org_id=org_id, key_id=key_id, endpoint="/v1/chat/completions",
                             input_file_id="file-x", input_blob_key="files/x", completion_window="24h",
                             priority="standard", status=BatchStatus.IN_PROGRESS, model="m", created_at=created,
                             expires_at=created + 86_400, total=1), now_ns(), [])
        assert BatchLeases(db).claim("bench", {"m": 10 ** 9}, 60.0) is not None
        started = time.perf_counter()
        results.finalize(batch_id, "bench", status=BatchStatus.COMPLETED, output=None, error=None, org_id=org_id,
                         unrun=0)
        taken.append((time.perf_counter() - started) * 1000)
    return taken


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"p50_ms": round(statistics.median(ordered), 2), "p95_ms": round(ordered[int(len(ordered) * 0.95)], 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--endpoints", type=int, default=1)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_receiver() as receiver:
        url = create_pg_database() if args.postgres else f"sqlite:///{tmp}/bench.db"
        db = Database(url)
        db.migrate()
        try:
            accounts, store = Accounts(db), WebhookStore(db)
            quiet, loud = accounts.create_org("no-endpoints"), accounts.create_org("endpoints")
            for i in range(args.endpoints):
                store.add_endpoint(loud.id, receiver.url(f"bench{i}"), "whsec_" + "A" * 44, limit=16)
            without = finalize_times(db, quiet.id, accounts.create_key(quiet.id)[0].id, args.batches)
            with_endpoints = finalize_times(db, loud.id, accounts.create_key(loud.id)[0].id, args.batches)

            catalog = parse_catalog(f'[webhooks]\nallow = ["{receiver.base}/hooks/"]\n')
            delivery = WebhookDelivery(store, catalog, Settings.build(data_dir=Path(tmp), database_url=url))
            started, sent = time.perf_counter(), 0
            while attempts := asyncio.run(delivery.deliver_due()):
                sent += sum(1 for a in attempts if a.outcome == "delivered")
            elapsed = time.perf_counter() - started
            received = sum(len(receiver.requests(f"bench{i}")) for i in range(args.endpoints))
            print(json.dumps({
                "store": "postgres" if args.postgres else "sqlite", "batches": args.batches,
                "endpoints": args.endpoints, "finalize_without_endpoints": summary(without),
                "finalize_with_endpoints": summary(with_endpoints), "delivered": sent, "received": received,
                "deliveries_per_second": round(sent / elapsed, 1),
            }))
        finally:
            db.dispose()
            if args.postgres:
                drop_pg_database(url)


if __name__ == "__main__":
    main()
