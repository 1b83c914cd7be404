"""Webhooks: what the outbox adds to a batch's finalizing, how fast delivery loops drain it, and how long one
organization's healthy endpoint waits beside another's hostile ones.

    .venv/bin/python bench/bench_webhooks.py [--batches 500] [--endpoints 1] [--loops 1] [--postgres]
    .venv/bin/python bench/bench_webhooks.py --isolation [--bad-batches 10] [--samples 10] [--loops 1] [--postgres]

On a fresh store (SQLite in a temp dir, or a fresh database on ``OPENRELAY_TEST_PG``), with the tests' receiver
process and the default settings but shorter polls.

Default: finalizes ``--batches`` leased batches of an organization without endpoints, then as many of one with
``--endpoints`` endpoints (the finalizing then also writes a delivery per endpoint; an organization without
endpoints writes the event only), p50/p95 of each finalizing; then ``--loops`` delivery loops drain the outbox into
the receiver, answering 200 at once: deliveries per second, every one received once.

``--isolation``: organization A's one healthy endpoint gets ``--samples`` events, one a second, alone; then
organization B registers 16 endpoints (6 that hang, 5 that trickle their answer a byte every 2 s, 5 that answer
500) and ends ``--bad-batches`` batches, and A's endpoint gets as many events again beside them. For each, the
seconds from the batch's end to the receiver getting its event (``--cap`` at most: past it, counted as not
delivered). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.catalog import parse_catalog  # noqa: E402
from openrelay.clock import now, now_ns  # noqa: E402
from openrelay.config import Settings  # noqa: E402
from openrelay.ids import new_batch_id  # noqa: E402
from openrelay.store.accounts import Accounts  # noqa: E402
from openrelay.store.batches import Batches  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from openrelay.store.leases import BatchLeases  # noqa: E402
from openrelay.store.results import Results  # noqa: E402
from openrelay.types import Batch, BatchStatus  # noqa: E402
from openrelay.webhooks.delivery import WebhookDelivery  # noqa: E402
from tests.support.server import create_pg_database, drop_pg_database  # noqa: E402
from tests.support.webhook_loops import WebhookStores  # noqa: E402
from tests.support.webhook_receiver import Receiver, running_receiver  # noqa: E402


def end_batch(db: Database, org_id: str, key_id: str) -> float:
    """A leased batch of the organization finalized now; the milliseconds the finalizing took."""
    batch_id, created = new_batch_id(), now()
    Batches(db).create(Batch(id=batch_id, org_id=org_id, key_id=key_id, endpoint="/v1/chat/completions",
                             input_file_id="file-x", input_blob_key="files/x", completion_window="24h",
                             priority="standard", status=BatchStatus.IN_PROGRESS, model="m", created_at=created,
                             expires_at=created + 86_400, total=1), now_ns(), [])
    assert BatchLeases(db).claim("bench", {"m": 10 ** 9}, 60.0) is not None
    started = time.perf_counter()
    Results(db).finalize(batch_id, "bench", status=BatchStatus.COMPLETED, output=None, error=None, org_id=org_id,
                         unrun=0)
    return (time.perf_counter() - started) * 1000


def summary(values: list[float], digits: int = 2) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), digits), "p95": round(ordered[int(len(ordered) * 0.95)], digits),
            "max": round(ordered[-1], digits)}


class Loops:
    """``count`` delivery loops on an event loop of their own thread, until ``stop``."""

    def __init__(self, store: WebhookStores, receiver: Receiver, settings: Settings, count: int) -> None:
        catalog = parse_catalog(f'[webhooks]\nallow = ["{receiver.base}/hooks/"]\n')
        self.loops = [WebhookDelivery(store.outbox, store.log, catalog, settings) for _ in range(count)]
        self.started = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self.thread.start()
        self.started.wait(30)

    async def _run(self) -> None:
        self.loop, self.stopping = asyncio.get_running_loop(), asyncio.Event()
        self.started.set()
        await asyncio.gather(*(loop.run_forever(self.stopping) for loop in self.loops))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(60)


def wait_until(check: Callable[[], bool], cap: float) -> bool:
    deadline = time.monotonic() + cap
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def throughput(db: Database, receiver: Receiver, settings: Settings, args: argparse.Namespace) -> dict[str, object]:
    accounts, store = Accounts(db), WebhookStores.of(db)
    quiet, loud = accounts.create_org("no-endpoints"), accounts.create_org("endpoints")
    for i in range(args.endpoints):
        store.endpoints.add_endpoint(loud.id, receiver.url(f"bench{i}"), "whsec_" + "A" * 44, limit=16)
    quiet_key, loud_key = accounts.create_key(quiet.id)[0].id, accounts.create_key(loud.id)[0].id
    without = [end_batch(db, quiet.id, quiet_key) for _ in range(args.batches)]
    with_endpoints = [end_batch(db, loud.id, loud_key) for _ in range(args.batches)]
    expected = args.batches * args.endpoints

    def received() -> int:
        return sum(len(receiver.requests(f"bench{i}")) for i in range(args.endpoints))

    started = time.perf_counter()
    loops = Loops(store, receiver, settings, args.loops)
    wait_until(lambda: received() >= expected and len(store.log.attempts(org_id=loud.id, limit=expected)) >= expected,
               args.cap)
    elapsed = time.perf_counter() - started
    loops.stop()
    return {"finalize_ms_without_endpoints": summary(without), "finalize_ms_with_endpoints": summary(with_endpoints),
            "received": received(), "deliveries_per_second": round(expected / elapsed, 1)}


def isolation(db: Database, receiver: Receiver, settings: Settings, args: argparse.Namespace) -> dict[str, object]:
    accounts, store, tag = Accounts(db), WebhookStores.of(db), f"{time.time_ns():x}"
    healthy, hostile = accounts.create_org("healthy"), accounts.create_org("hostile")
    healthy_key, hostile_key = accounts.create_key(healthy.id)[0].id, accounts.create_key(hostile.id)[0].id
    store.endpoints.add_endpoint(healthy.id, receiver.url(f"a-{tag}"), "whsec_" + "A" * 44, limit=16)
    kinds = {f"{kind}{i}-{tag}": kind for i, kind in enumerate(["hang"] * 6 + ["trickle"] * 5 + ["fail"] * 5)}
    loops = Loops(store, receiver, settings, args.loops)

    def latencies() -> list[float | None]:
        """Seconds from each of A's batches' ends to the receiver getting its event, one batch a second."""
        ended, seen = [], len(receiver.requests(f"a-{tag}"))
        for _ in range(args.samples):
            ended.append(time.time())
            end_batch(db, healthy.id, healthy_key)
            time.sleep(1.0)
        wait_until(lambda: len(receiver.requests(f"a-{tag}")) >= seen + args.samples, args.cap)
        got = [r["received_at"] for r in receiver.requests(f"a-{tag}")[seen:]]
        return [round(got[i] - at, 3) if i < len(got) else None for i, at in enumerate(ended)]

    try:
        alone = latencies()
        for hook, kind in kinds.items():
            if kind == "hang":
                receiver.hold(hook)
            elif kind == "trickle":
                receiver.trickle(hook, every=2.0)
            else:
                receiver.fail(hook, 10 ** 6, status=500)
            store.endpoints.add_endpoint(hostile.id, receiver.url(hook), "whsec_" + "A" * 44, limit=16)
        for _ in range(args.bad_batches):
            end_batch(db, hostile.id, hostile_key)
        beside = latencies()
        hostile_attempts = sum(len(receiver.requests(hook)) for hook in kinds)
    finally:
        for hook, kind in kinds.items():
            if kind == "hang":
                receiver.hold(hook, False)
            elif kind == "trickle":
                receiver.trickle(hook, None)
        loops.stop()
    return {"bad_batches": args.bad_batches, "alone_s": summary([s for s in alone if s is not None], 3),
            "beside_hostile_s": summary([s for s in beside if s is not None], 3) if any(beside) else None,
            "beside_hostile_each_s": beside, "not_delivered_within_cap": beside.count(None),
            "hostile_attempts": hostile_attempts}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--isolation", action="store_true")
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--endpoints", type=int, default=1)
    parser.add_argument("--bad-batches", type=int, default=10)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--loops", type=int, default=1)
    parser.add_argument("--cap", type=float, default=300.0)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_receiver() as receiver:
        url = create_pg_database() if args.postgres else f"sqlite:///{tmp}/bench.db"
        db = Database(url)
        db.migrate()
        try:
            settings = Settings.build(data_dir=Path(tmp), database_url=url)
            settings = dataclasses.replace(settings, webhooks=dataclasses.replace(settings.webhooks,
                                                                                  poll_seconds=0.05))
            found = (isolation if args.isolation else throughput)(db, receiver, settings, args)
            print(json.dumps({"store": "postgres" if args.postgres else "sqlite", "loops": args.loops,
                              **({} if args.isolation else {"batches": args.batches, "endpoints": args.endpoints}),
                              **found}))
        finally:
            db.dispose()
            if args.postgres:
                drop_pg_database(url)


if __name__ == "__main__":
    main()
