"""What polling a batch costs next to the HTTP stack alone (issue 10 part 8; goals of issue 36 part 2).

    .venv/bin/python bench/bench_polling.py [--duration 8] [--connections 10] [--rounds 3]
                                            [--postgres | --database-url URL]

Starts a real `orl serve` (SQLite in a temporary directory; ``--postgres``: a fresh database on the test
PostgreSQL server, ``OPENRELAY_TEST_PG``, dropped afterwards; ``--database-url``: any store) on the zero-latency
test engine, with one batch held running (its records sleep in the
engine, so it stays ``in_progress`` and the worker keeps writing results beside the polls) and 30 more queued
behind it, so that a page of 20 is full. Then Debian's `wrk` (a C load generator) runs, in turn, against
``GET /healthz``, ``GET /v1/batches/{id}`` and ``GET /v1/batches?limit=20``; each round gives the two ratios of
requests/s against healthz measured in that round, and the p99 latency of each. Goals: >= 0.35 and >= 0.25.
Absolute figures depend on the machine; the ratios are the figure. ``OPENRELAY_POLL_CACHE_SECONDS=0`` in the
environment measures the polls without the API's poll cache.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server import Server, create_pg_database, drop_pg_database, free_port  # noqa: E402
from tests.support.test_engine import start_test_engine, stop_test_engine  # noqa: E402

CATALOG = """
[[models]]
name = "bench/echo"
endpoints = ["/v1/chat/completions"]
slots = 1
concurrency = 4
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "echo" }}
"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True, kw_only=True)
class WrkRun:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    non_2xx: int


def parse_wrk(text: str) -> WrkRun:
    """The figures of ``wrk --latency`` output."""

    def latency(label: str) -> float:
        match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", text, re.MULTILINE)
        if match is None:
            raise ValueError(f"no {label}% latency in wrk output:\n{text}")
        return float(match.group(1)) * _UNITS[match.group(2)]

    rate = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.MULTILINE)
    if rate is None:
        raise ValueError(f"no Requests/sec in wrk output:\n{text}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    return WrkRun(requests_per_second=float(rate.group(1)), p50_ms=latency("50"), p99_ms=latency("99"),
                  non_2xx=int(bad.group(1)) if bad else 0)


def wrk(url: str, api_key: str, *, seconds: float, connections: int, threads: int) -> WrkRun:
    done = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency",
         "-H", f"Authorization: Bearer {api_key}", url],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    )
    run = parse_wrk(done.stdout)
    if run.non_2xx:
        raise RuntimeError(f"{url}: {run.non_2xx} answers were not 2xx:\n{done.stdout}")
    return run


def record(i: int, sleep_seconds: float) -> bytes:
    return orjson.dumps({
        "custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "bench/echo", "max_tokens": 16,
                 "messages": [{"role": "user", "content": f"item {i} #sleep={sleep_seconds}"}]},
    }) + b"\n"


def create(server: Server, api_key: str, records: list[bytes], tags: str) -> dict:
    uploaded = server.http("POST", "/files", api_key=api_key, files={"file": ("in.jsonl", b"".join(records))},
                           data={"purpose": "batch"})
    uploaded.raise_for_status()
    answer = server.http("POST", "/batches", api_key=api_key, json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": {"tags": tags},
        "input_file_id": uploaded.json()["id"],
    })
    answer.raise_for_status()
    return answer.json()


def wait_running(server: Server, api_key: str, batch_id: str) -> None:
    for _ in range(600):
        batch = server.http("GET", f"/batches/{batch_id}", api_key=api_key).json()
        if batch["in_progress_at"] is not None:
            return
        time.sleep(0.1)
    raise RuntimeError(f"batch {batch_id} did not start: {batch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of wrk per endpoint and round")
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three endpoints, in turn")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--postgres", action="store_true", help="a fresh database on the test PostgreSQL server")
    store.add_argument("--database-url", default=None, help="the store (default: SQLite in a temp dir)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    work = Path(tempfile.mkdtemp(prefix="orl-bench-polling-"))
    (work / "data").mkdir()
    engine_proc, engine_url = start_test_engine("--no-record")
    catalog = work / "catalog.toml"
    catalog.write_text(CATALOG.format(engine=engine_url))
    fresh_pg = create_pg_database() if args.postgres else None
    database_url = fresh_pg or args.database_url or f"sqlite:///{work / 'data' / 'openrelay.db'}"
    server = Server(data_dir=work / "data", database_url=database_url, port=free_port(), env={},
                    args=["--catalog", str(catalog)])
    try:
        server.start()
        api_key = server.new_org_key()
        # The running batch: 4 records in flight at a time, each held 2 s by the engine, for far longer than the
        # measurement; the worker keeps flushing results and renewing its lease meanwhile.
        running = create(server, api_key, [record(i, 2) for i in range(2000)], "bench,running")
        for n in range(30):  # queued behind it (one slot): a full page of 20 for the list
            create(server, api_key, [record(i, 0) for i in range(3)], f"bench,queued-{n}")
        wait_running(server, api_key, running["id"])
        root = f"http://127.0.0.1:{server.port}"
        targets = {"healthz": f"{root}/healthz", "get": f"{server.base_url}/batches/{running['id']}",
                   "list": f"{server.base_url}/batches?limit=20"}
        page = server.http("GET", "/batches?limit=20", api_key=api_key).json()
        assert len(page["data"]) == 20 and page["has_more"] is True, page
        for url in targets.values():  # warm up: connections, caches, the interpreter's specializations
            wrk(url, api_key, seconds=1, connections=args.connections, threads=args.threads)
        rows = []
        for _ in range(args.rounds):
            rows.append({name: wrk(url, api_key, seconds=args.duration, connections=args.connections,
                                   threads=args.threads) for name, url in targets.items()})
        batch = server.http("GET", f"/batches/{running['id']}", api_key=api_key).json()
        assert batch["status"] == "in_progress", batch  # it ran all along
        store = "PostgreSQL" if database_url.startswith("postgres") else "SQLite"
        print(f"store: {store}; wrk -t{args.threads} -c{args.connections} -d{args.duration:g}s, "
              f"{args.rounds} rounds; batch {running['id']} in progress, {batch['request_counts']['completed']} "
              f"records done during the run")
        for i, row in enumerate(rows, 1):
            h, g, lst = row["healthz"], row["get"], row["list"]
            print(f"  round {i}: healthz {h.requests_per_second:,.0f} req/s (p99 {h.p99_ms:.2f} ms); "
                  f"GET /v1/batches/{{id}} {g.requests_per_second:,.0f} (p99 {g.p99_ms:.2f} ms), "
                  f"ratio {g.requests_per_second / h.requests_per_second:.2f}; "
                  f"GET /v1/batches?limit=20 {lst.requests_per_second:,.0f} (p99 {lst.p99_ms:.2f} ms), "
                  f"ratio {lst.requests_per_second / h.requests_per_second:.2f}")
        for name, goal in (("get", 0.35), ("list", 0.25)):
            ratios = [row[name].requests_per_second / row["healthz"].requests_per_second for row in rows]
            p99 = max(row[name].p99_ms for row in rows)
            label = "GET /v1/batches/{id}" if name == "get" else "GET /v1/batches?limit=20"
            print(f"{label}: median ratio to healthz {statistics.median(ratios):.2f} (goal >= {goal}), "
                  f"worst p99 {p99:.2f} ms")
        server.http("POST", f"/batches/{running['id']}/cancel", api_key=api_key)
    finally:
        server.stop()
        stop_test_engine(engine_proc)
        if fresh_pg:
            drop_pg_database(fresh_pg)
        if os.environ.get("KEEP_BENCH_DIR") is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
