"""Benchmark for issue 14 part 2: reading a running batch's result file when it is made of many chunks.

    .venv/bin/python bench/bench_partial_results.py [--records 2000] [--requests 50] [--concurrency 1] [--postgres]

Starts the test engine and a real ``orl serve`` that writes a chunk per finished record
(``OPENRELAY_FLUSH_RECORDS=1``), runs a batch of ``--records`` quick records plus one the engine holds, so that the
batch stays ``in_progress`` with about one chunk per record, and then times over HTTP on one keep-alive
connection, ``--requests`` times each:

- ``retrieve``: ``GET /v1/files/file-<batch>-output`` (the partial file object);
- ``download``: ``GET .../content``, the whole partial file;
- ``follow``: ``GET .../content`` with ``Range: bytes=N-`` for the last line only (what a follower asks each poll).

Then the same with the chunk rows' sizes set to NULL, which is what a read costs for chunks written before
migration 0009 (every size asked of the blob store). p50 and p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server import (  # noqa: E402
    TEST_CATALOG,
    Server,
    create_pg_database,
    drop_pg_database,
    free_port,
)
from tests.support.test_engine import EngineControl, start_test_engine, stop_test_engine  # noqa: E402

GATE = "bench-partial-tail"


def _timings(call: Callable[[], httpx.Response], n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        answer = call()
        samples.append((time.perf_counter() - started) * 1000)
        assert answer.status_code in (200, 206), answer.text
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=1, help="records in flight (1: about a chunk each)")
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()

    engine_proc, engine_url = start_test_engine("--no-record")
    engine = EngineControl(engine_url)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-partial-"))
    url = create_pg_database() if args.postgres else f"sqlite:///{data_dir / 'openrelay.db'}"
    catalog = data_dir / "catalog.toml"
    catalog.write_text(TEST_CATALOG.format(engine=engine_url, slots=1, concurrency=args.concurrency))
    server = Server(data_dir=data_dir, database_url=url, port=free_port(), args=["--catalog", str(catalog)],
                    env={"OPENRELAY_FLUSH_RECORDS": "1", "OPENRELAY_FLUSH_SECONDS": "0.01",
                         "OPENRELAY_TICK_SECONDS": "0.05"})
    server.start()
    store = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        records = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "test/echo", "messages": [{"role": "user", "content": f"quick {i}"}]}}
                   for i in range(args.records)]
        records.append({**records[0], "custom_id": "tail",
                        "body": {"model": "test/echo", "messages": [{"role": "user", "content": f"#hold={GATE}"}]}})
        created = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions",
                                                        "completion_window": "24h", "requests": records}).json()
        batch_id = created["id"]
        deadline = time.time() + 600
        while server.http("GET", f"/batches/{batch_id}").json()["request_counts"]["completed"] < args.records:
            assert time.time() < deadline, "the batch did not get through its records"
            time.sleep(0.2)
        with store.connect() as conn:
            chunks = conn.execute(sa.text("SELECT count(*) FROM batch_chunks WHERE batch_id = :b"),
                                  {"b": batch_id}).scalar_one()
        file_id = f"file-{batch_id}-output"
        http = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {server.api_key}"},
                            timeout=120)
        found = http.get(f"/files/{file_id}").json()
        assert found["status"] == "partial", found
        last = http.get(f"/files/{file_id}/content").content.splitlines()[-1]
        start = found["bytes"] - len(last) - 1
        print(f"{'sqlite' if not args.postgres else 'postgres'}: batch {batch_id} in_progress, "
              f"{found['openrelay']['lines']} lines, {found['bytes']:,} bytes, {chunks} chunks")
        for label in ("sizes in the chunk rows (0009)", "sizes asked of the blob store (rows before 0009)"):
            cases = {
                "retrieve": lambda: http.get(f"/files/{file_id}"),
                "download": lambda: http.get(f"/files/{file_id}/content"),
                "follow": lambda: http.get(f"/files/{file_id}/content", headers={"range": f"bytes={start}-"}),
            }
            print(f"  {label}:")
            for name, call in cases.items():
                p50, p95 = _timings(call, args.requests)
                print(f"    {name:9s} p50 {p50:8.1f} ms   p95 {p95:8.1f} ms")
            with store.begin() as conn:
                conn.execute(sa.text("UPDATE batch_chunks SET out_bytes = NULL, err_bytes = NULL "
                                     "WHERE batch_id = :b"), {"b": batch_id})
        assert orjson.loads(last)["custom_id"].startswith("r")
        engine.release(GATE)
        http.close()
    finally:
        store.dispose()
        server.stop()
        stop_test_engine(engine_proc)
        if args.postgres:
            drop_pg_database(url)


if __name__ == "__main__":
    main()
