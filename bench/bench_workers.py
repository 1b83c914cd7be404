"""Benchmark for issue 13 part 7: records/s with 1 and with 3 `orl worker` processes, in one run.

    .venv/bin/python bench/bench_workers.py [--delay 0.2] [--slots 6] [--concurrency 8] [--batches 12]
                                            [--records 100] [--workers 1,3] [--max-batches N] [--sqlite]

Each case is a deployment of its own, as on many machines: a fresh PostgreSQL database on the test server
(``OPENRELAY_TEST_PG``, dropped afterwards; ``--sqlite``: a shared SQLite file), one SeaweedFS bucket (a server
this script starts), `orl serve --no-worker` and N `orl worker` processes, each with its own data directory. The
test engine answers every request after ``--delay`` seconds (latency-bound, as a GPU engine under load is). The
batches are created while the workers run; the figure is every record of every batch completed, divided by the
time from the first create to the last batch terminal. Prints one JSON line per case and the ratio. Without
``--max-batches`` the workers split the model's slots by themselves (``ceil(slots / live workers)`` each), so the
engine's ceiling is the same for one worker and three; with ``--max-batches 2`` and 6 slots, one worker runs 2
batches at once and three run 6.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.forked import ORL  # noqa: E402
from tests.support.seaweed import start_seaweed, stop_seaweed  # noqa: E402
from tests.support.server import Server, create_pg_database, drop_pg_database, free_port  # noqa: E402
from tests.support.test_engine import EngineControl, start_test_engine, stop_test_engine  # noqa: E402

CATALOG = """
[[models]]
name = "bench/echo"
endpoints = ["/v1/chat/completions"]
slots = {slots}
concurrency = {concurrency}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "echo", timeout_seconds = 60 }}
"""


def run_case(args: argparse.Namespace, workers: int, engine_url: str, weed, bucket: str) -> dict:
    root = Path(tempfile.mkdtemp(prefix="orl-bench-workers-"))
    catalog = root / "catalog.toml"
    catalog.write_text(CATALOG.format(slots=args.slots, concurrency=args.concurrency, engine=engine_url))
    url = f"sqlite:///{root / 'openrelay.db'}" if args.sqlite else create_pg_database()
    blob_url = f"s3://{bucket}/bench-{secrets.token_hex(3)}"
    env = {**weed.env(), "OPENRELAY_BLOB_URL": blob_url, "OPENRELAY_TICK_SECONDS": "0.05"}
    (root / "api").mkdir()
    api = Server(data_dir=root / "api", database_url=url, port=free_port(), env=env,
                 args=["--no-worker", "--catalog", str(catalog)])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        api.start()
        for i in range(workers):
            (root / f"w{i}").mkdir()
            log = open(root / f"w{i}.log", "wb")  # noqa: SIM115 - the child writes to it until the case ends
            cap = ["--max-batches", str(args.max_batches)] if args.max_batches else []
            procs.append(subprocess.Popen([ORL, "worker", "--data-dir", str(root / f"w{i}"), "--database-url", url,
                                           "--catalog", str(catalog), *cap], stdout=log, stderr=subprocess.STDOUT,
                                          env={**os.environ, **env}))
        # Each worker has counted every other (its share of the slots is theirs over all of them).
        seen = "serving bench/echo" if workers == 1 else f"live workers serving bench/echo {workers}"
        for i in range(workers):
            deadline = time.monotonic() + 60
            while seen not in (root / f"w{i}.log").read_text(errors="replace"):
                assert time.monotonic() < deadline and procs[i].poll() is None, (root / f"w{i}.log").read_text()
                time.sleep(0.1)
        started = time.monotonic()
        ids = []
        for b in range(args.batches):
            records = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "bench/echo", "messages": [{"role": "user", "content": f"b{b} r{i}"}]}}
                       for i in range(args.records)]
            answer = api.http("POST", "/batches", json={"endpoint": "/v1/chat/completions",
                                                        "completion_window": "24h", "requests": records})
            assert answer.status_code == 200, answer.text
            ids.append(answer.json()["id"])
        completed = 0
        for batch_id in ids:
            done = api.wait(batch_id, timeout=600)
            assert done["status"] == "completed", done
            completed += done["request_counts"]["completed"]
        elapsed = time.monotonic() - started
        runs = [(root / f"w{i}.log").read_text(errors="replace").count("in_progress)") for i in range(workers)]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        api.stop()
        if not args.sqlite:
            drop_pg_database(url)
        shutil.rmtree(root, ignore_errors=True)
    return {"workers": workers, "records": completed, "seconds": round(elapsed, 2),
            "records_per_second": round(completed / elapsed, 1), "batches_run_per_worker": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the engine takes per request")
    parser.add_argument("--slots", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--workers", default="1,3", help="comma-separated worker counts, one case each")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="each worker's cap (orl worker --max-batches); default: none, one worker may hold "
                             "every slot")
    parser.add_argument("--sqlite", action="store_true", help="a shared SQLite file instead of PostgreSQL")
    args = parser.parse_args()
    engine_proc, engine_url = start_test_engine("--no-record")
    weed = start_seaweed()
    bucket = "orl-bench-" + secrets.token_hex(4)
    assert weed.bucket_request("PUT", bucket).status_code == 200
    try:
        EngineControl(engine_url).mode(delay=args.delay)
        results = []
        for count in (int(n) for n in args.workers.split(",")):
            results.append(run_case(args, count, engine_url, weed, bucket))
            print(orjson.dumps(results[-1]).decode(), flush=True)
        ceiling = args.slots * args.concurrency / args.delay  # the fleet's, whatever the cap
        print(orjson.dumps({"ceiling_records_per_second": round(ceiling, 1),
                            "ratio_last_to_first": round(results[-1]["records_per_second"]
                                                         / results[0]["records_per_second"], 2)}).decode())
    finally:
        stop_seaweed(weed)
        stop_test_engine(engine_proc)


if __name__ == "__main__":
    main()
