"""Benchmark for issue 24 part 4: many small inline batches, the per-batch start and end cost.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_batches.py [--batches 200] [--records 1] [--slots 2]
                                                                   [--postgres] [--workers 0]

One `orl serve` (its own worker, default settings: the tick and lease a deployment runs with) on a fresh SQLite
file (``--postgres``: a fresh database on the test server, dropped afterwards), plus ``--workers`` `orl worker`
processes beside it, against the test engine answering at once (zero latency), so what is measured is each
batch's claim, input scan, run and finalize, not the engine. ``--batches`` inline batches of ``--records`` records
each are created back to back; the figure is batches ended per second, from the first create to the last batch
terminal. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.batches import chat  # noqa: E402
from tests.support.server import Server, catalog_text, create_pg_database, drop_pg_database, free_port  # noqa: E402
from tests.support.test_engine import start_test_engine, stop_test_engine  # noqa: E402
from tests.support.workers import WorkerProcess  # noqa: E402


def run(args: argparse.Namespace, engine_url: str) -> dict:
    root = Path(tempfile.mkdtemp(prefix="orl-bench-small-"))
    catalog = root / "catalog.toml"
    catalog.write_text(catalog_text(engine_url, slots=args.slots, concurrency=8))
    url = create_pg_database() if args.postgres else f"sqlite:///{root / 'openrelay.db'}"
    server = Server(data_dir=root, database_url=url, port=free_port(), env={}, args=["--catalog", str(catalog)])
    workers: list[WorkerProcess] = []
    try:
        server.start()
        workers = [WorkerProcess.beside(server, f"worker{i}") for i in range(args.workers)]
        started = time.monotonic()
        ids = []
        for b in range(args.batches):
            answer = server.http("POST", "/batches", json={
                "endpoint": "/v1/chat/completions", "completion_window": "24h",
                "requests": [chat(f"b{b}-{i}", f"batch {b} record {i}") for i in range(args.records)]})
            assert answer.status_code == 200, answer.text
            ids.append(answer.json()["id"])
        created = time.monotonic() - started
        for batch_id in ids:
            assert server.wait(batch_id, timeout=600)["status"] == "completed"
        elapsed = time.monotonic() - started
    finally:
        for worker in workers:
            worker.stop()
        server.stop()
        if args.postgres:
            drop_pg_database(url)
    return {"store": "postgres" if args.postgres else "sqlite", "batches": args.batches, "records": args.records,
            "slots": args.slots, "workers": 1 + args.workers, "create_seconds": round(created, 2),
            "seconds": round(elapsed, 2), "batches_per_second": round(args.batches / elapsed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--records", type=int, default=1)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="`orl worker` processes beside the server's own")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of a SQLite file")
    args = parser.parse_args()
    engine, engine_url = start_test_engine("--no-record")
    try:
        print(orjson.dumps(run(args, engine_url)).decode(), flush=True)
    finally:
        stop_test_engine(engine)


if __name__ == "__main__":
    main()
