"""A claim's time with N queued batches of one model from 10 organizations, on a fresh PostgreSQL database.

    .venv/bin/python bench/bench_claim_queue.py 1400 10000

The store's own claim (``BatchLeases.claim``, one slot) is timed five times per size, the claimed batch put back in
the queue after each; the median and best are printed. Run it from two checkouts to compare their claims.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.store.accounts import Accounts  # noqa: E402
from openrelay.store.batch_rows import batch_values  # noqa: E402
from openrelay.store.db import Database  # noqa: E402
from openrelay.store.leases import BatchLeases  # noqa: E402
from openrelay.store.schema import batches  # noqa: E402
from openrelay.types import Batch, BatchStatus  # noqa: E402
from tests.support.server import create_pg_database, drop_pg_database  # noqa: E402


def claim_seconds(queued: int) -> list[float]:
    url = create_pg_database()
    db = Database(url)
    try:
        db.migrate()
        accounts = Accounts(db)
        orgs = [accounts.create_org(f"org{o}").id for o in range(10)]
        keys = [accounts.create_key(org)[0].id for org in orgs]
        now = int(time.time())
        rows = [batch_values(Batch(
            id=f"batch_{i:07d}", org_id=orgs[i % 10], key_id=keys[i % 10], endpoint="/v1/chat/completions",
            input_file_id="file-x", input_blob_key="x", completion_window="24h", priority="standard",
            status=BatchStatus.IN_PROGRESS, model="m", created_at=now, expires_at=now + 86400, total=1, failed=0,
            rejected_count=0), i) for i in range(queued)]
        with db.write() as conn:
            conn.execute(batches.insert(), rows)
        store = BatchLeases(db)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            claimed = store.claim("bench-worker", {"m": 1}, 60.0)
            times.append(time.perf_counter() - start)
            assert claimed is not None
            with db.write() as conn:  # back in the queue, for the next claim to find the same queue
                conn.execute(batches.update().where(batches.c.id == claimed.id)
                             .values(started=False, lease_owner=None, lease_expires_at=None))
        return times
    finally:
        db.dispose()
        drop_pg_database(url)


def main() -> None:
    for queued in [int(arg) for arg in sys.argv[1:]] or [1400, 10000]:
        times = claim_seconds(queued)
        print(f"{queued:,} queued: claim median {statistics.median(times) * 1000:.1f} ms, "
              f"best {min(times) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
