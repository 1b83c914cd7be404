"""Benchmark for issue 13 part 7: what S3 costs against local disk, for a large create and for result writes.

    .venv/bin/python bench/bench_blob_stores.py [--records 50000] [--run-records 20000] [--concurrency 64]
                                                [--rounds 2]

Two `orl serve` processes on their own SQLite stores, the same in all but the blob store: a directory, or a bucket
on a SeaweedFS server this script starts (``--blob-url s3://...``). Each round, on each in turn (alternating which
goes first): the upload of a ``--records`` JSONL file (``POST /v1/files``), the create of a batch from it
(``POST /v1/batches``, which reads the file back and validates every record), and the run of a ``--run-records``
batch against the zero-latency test engine (from the create's answer until a poll every 0.1 s sees it completed),
whose chunks and result files are the result writes. Prints
the median of each phase per store and the ratio S3 / local. Absolute figures depend on the machine; the ratios
measured in one run are the figure.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_batches import CATALOG, upload, write_records  # noqa: E402
from tests.support.seaweed import start_seaweed, stop_seaweed  # noqa: E402
from tests.support.server import Server, free_port  # noqa: E402
from tests.support.test_engine import start_test_engine, stop_test_engine  # noqa: E402


def timed_upload(server: Server, path: Path) -> tuple[float, str]:
    start = time.perf_counter()
    file_id = upload(server, path)
    return time.perf_counter() - start, file_id


def timed_create(server: Server, file_id: str) -> tuple[float, str]:
    start = time.perf_counter()
    answer = server.http("POST", "/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                   "completion_window": "24h"})
    elapsed = time.perf_counter() - start
    assert answer.status_code == 200, answer.text
    return elapsed, answer.json()["id"]


def run_seconds(server: Server, file_id: str) -> float:
    """From the create's answer until a poll (every 0.1 s) sees the batch completed."""
    _create, batch_id = timed_create(server, file_id)
    start = time.perf_counter()
    done = server.wait(batch_id, timeout=900)
    elapsed = time.perf_counter() - start
    assert done["status"] == "completed" and done["request_counts"]["failed"] == 0, done
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--run-records", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orl-bench-blobs-"))
    engine_proc, engine_url = start_test_engine("--no-record")
    weed = start_seaweed()
    bucket = "orl-bench-" + secrets.token_hex(4)
    assert weed.bucket_request("PUT", bucket).status_code == 200
    servers: dict[str, Server] = {}
    try:
        big, small = root / "big.jsonl", root / "small.jsonl"
        write_records(big, args.records)
        write_records(small, args.run_records)
        catalog = root / "catalog.toml"
        catalog.write_text(CATALOG.format(concurrency=args.concurrency, engine=engine_url))
        for name, env in (("local", {}),
                          ("s3", {**weed.env(), "OPENRELAY_BLOB_URL": f"s3://{bucket}/bench-{secrets.token_hex(3)}"})):
            (root / name).mkdir()
            servers[name] = Server(data_dir=root / name, database_url=f"sqlite:///{root / name / 'orl.db'}",
                                   port=free_port(), env=env,
                                   args=["--catalog", str(catalog)]).start()
        figures: dict[str, dict[str, list[float]]] = {n: {"upload": [], "create": [], "run": []} for n in servers}
        for round_no in range(args.rounds):
            order = list(servers) if round_no % 2 == 0 else list(reversed(servers))
            for name in order:
                server = servers[name]
                seconds, file_id = timed_upload(server, big)
                figures[name]["upload"].append(seconds)
                seconds, batch_id = timed_create(server, file_id)
                figures[name]["create"].append(seconds)
                server.http("POST", f"/batches/{batch_id}/cancel")  # the big one is for the create only
                server.wait(batch_id, timeout=600)
                _seconds, small_id = timed_upload(server, small)
                figures[name]["run"].append(run_seconds(server, small_id))
                print(orjson.dumps({"round": round_no + 1, "store": name,
                                    **{k: round(v[-1], 3) for k, v in figures[name].items()}}).decode(), flush=True)
        medians = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in figures.items()}
        for phase, what in (("upload", f"upload of {args.records:,} records"),
                            ("create", f"create from {args.records:,} records"),
                            ("run", f"run of {args.run_records:,} records (result writes)")):
            local, s3 = medians["local"][phase], medians["s3"][phase]
            print(f"{what}: local {local:.2f} s, S3 {s3:.2f} s, ratio S3/local {s3 / local:.2f}")
    finally:
        for server in servers.values():
            server.stop()
        stop_seaweed(weed)
        stop_test_engine(engine_proc)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
