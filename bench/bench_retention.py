"""Benchmark for issue 23 part 3: many small batches under a short retention, and the store coming back to its
baseline.

    .venv/bin/python bench/bench_retention.py [--batches 2000] [--retention-seconds 20] [--creators 8]
                                              [--stores sqlite-local,postgres-s3]

For each store: one `orl serve` on a fresh SQLite file with local blobs, or a fresh PostgreSQL database with its
blobs in a bucket on a SeaweedFS server this script starts; the zero-latency test engine; `--retention-days` of
``--retention-seconds`` and a sweeper pass looked for every second. The baseline is the rows per table and the blob
bytes once the first sweeper pass ran. ``--batches`` inline batches of three records (one answered, one refused by
the engine, one rejected at create: an input, an output, an error and a rejections file each) are made by
``--creators`` clients at once, each waiting for its batch to end before it creates the next (a steady stream: a
queue of thousands of batches of one model slows every claim on PostgreSQL, which is not what this measures);
rows and bytes are sampled every 2 s. Prints, per store: the creates' rate, the
peak rows of each table and the peak blob bytes, and how long after the last batch ended every row and byte was
back to the baseline. ``--batches`` 2000 took 6 to 10 minutes per store on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.batches import chat  # noqa: E402
from tests.support.seaweed import Seaweed, start_seaweed, stop_seaweed  # noqa: E402
from tests.support.server import Server, catalog_text, create_pg_database, drop_pg_database, free_port  # noqa: E402
from tests.support.store_rows import local_blobs, s3_blobs, table_rows  # noqa: E402
from tests.support.test_engine import start_test_engine, stop_test_engine  # noqa: E402

RECORDS = [chat("ok"), chat("refused", text="#status=400"), {"custom_id": "rejected"}]
SAMPLE_SECONDS = 2.0


class Sampler:
    """Rows per table and blob bytes, every ``SAMPLE_SECONDS`` in a thread, keeping each one's peak."""

    def __init__(self, read: Any) -> None:
        self.read = read
        self.peak_rows: dict[str, int] = {}
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> tuple[dict[str, int], int]:
        rows, size = self.read()
        self.peak_rows = {t: max(n, self.peak_rows.get(t, 0)) for t, n in rows.items()}
        self.peak_bytes = max(self.peak_bytes, size)
        return rows, size

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_store(name: str, server: Server, read: Any, batches: int, creators: int, retention: float,
              timeout: float) -> dict[str, Any]:
    wait_until(lambda: read()[0]["sweeps"], "the first sweeper pass", 60)
    baseline_rows, baseline_bytes = read()
    sampler = Sampler(read)
    start = time.monotonic()
    ids: list[str] = []

    def run_one(_i: int) -> str:
        answer = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions",
                                                       "completion_window": "24h", "requests": RECORDS})
        assert answer.status_code == 200, answer.text
        batch_id = answer.json()["id"]
        # Ended once it is seen ended or already pruned (a poll may miss it between the two).
        wait_until(lambda: server.http("GET", f"/batches/{batch_id}").json().get("status", "gone")
                   in ("completed", "gone"), f"batch {batch_id} to end", timeout, every=0.1)
        return batch_id

    with ThreadPoolExecutor(creators) as pool:
        ids = list(pool.map(run_one, range(batches)))
    assert len(set(ids)) == batches
    ended = time.monotonic() - start
    wait_until(lambda: sampler.sample() == (baseline_rows, baseline_bytes), "rows and bytes back to the baseline",
               timeout + retention)
    back = time.monotonic() - start
    sampler.stop()
    grown = {t: n for t, n in sampler.peak_rows.items() if n != baseline_rows.get(t)}
    result = {"store": name, "batches": batches, "batches_per_second": round(batches / ended, 1),
              "seconds_to_last_end": round(ended, 1), "seconds_back_to_baseline_after_last_end": round(back - ended, 1),
              "retention_seconds": retention, "baseline_rows": {t: n for t, n in baseline_rows.items() if n},
              "peak_rows": grown, "baseline_blob_bytes": baseline_bytes, "peak_blob_bytes": sampler.peak_bytes,
              "final_equals_baseline": read() == (baseline_rows, baseline_bytes)}
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return result


def wait_until(check: Any, what: str, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--retention-seconds", type=float, default=20.0)
    parser.add_argument("--creators", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--stores", default="sqlite-local,postgres-s3")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orl-bench-retention-"))
    engine_proc, engine_url = start_test_engine("--no-record")
    weed: Seaweed | None = None
    try:
        for name in args.stores.split(","):
            data_dir = root / name
            data_dir.mkdir()
            (data_dir / "catalog.toml").write_text(catalog_text(engine_url, slots=args.slots, concurrency=4))
            env = {"OPENRELAY_SWEEP_SECONDS": "1", "OPENRELAY_TICK_SECONDS": "0.05"}
            extra = ["--catalog", str(data_dir / "catalog.toml"),
                     "--retention-days", repr(args.retention_seconds / 86_400)]
            pg_url = None
            if name == "sqlite-local":
                url = f"sqlite:///{data_dir / 'openrelay.db'}"

                def blob_bytes(d: Path = data_dir) -> int:
                    return sum(local_blobs(d / "blobs").values())
            elif name == "postgres-s3":
                weed = weed or start_seaweed()
                bucket = "orl-bench-" + secrets.token_hex(4)
                assert weed.bucket_request("PUT", bucket).status_code == 200
                url = pg_url = create_pg_database()
                env |= weed.env()
                extra += ["--blob-url", f"s3://{bucket}/bench"]
                store = weed.store(bucket)

                def blob_bytes(s: Any = store) -> int:
                    return sum(s3_blobs(s, "bench/").values())
            else:
                raise SystemExit(f"unknown store {name!r}: sqlite-local or postgres-s3")
            server = Server(data_dir=data_dir, database_url=url, port=free_port(), env=env, args=extra).start()
            try:
                run_store(name, server, lambda u=url, b=blob_bytes: (table_rows(u), b()), args.batches,
                          args.creators, args.retention_seconds, args.timeout)
            finally:
                server.stop()
                if pg_url:
                    drop_pg_database(pg_url)
    finally:
        if weed is not None:
            stop_seaweed(weed)
        stop_test_engine(engine_proc)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
