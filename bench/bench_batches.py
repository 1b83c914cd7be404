"""Benchmarks for issue 2: create time vs plain orjson parsing, server memory during create, and throughput
through a running batch vs a direct asyncio client against the same zero-latency test engine.

    .venv/bin/python bench/bench_batches.py [--records 50000] [--run-records 20000] [--concurrency 64] [--pairs 6]
        [--workload plain|shared|both] [--create-only]

The create is timed on two workloads: ``plain`` (short records, each prompt its own) and ``shared`` (records that
open with one of a few long system prompts, shuffled, as a batch of evaluations or extractions does: the prefix
grouping's work, issue 20), each on a server of its own started with ``--no-worker`` (no run of an earlier batch
competes with the creates), over one kept-alive connection.

Every figure is measured in this run against a baseline measured in the same run; nothing is timed in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson
from pyreqwest.client import ClientBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server import Server, free_port  # noqa: E402
from tests.support.test_engine import start_test_engine, stop_test_engine  # noqa: E402

CATALOG = """
[[models]]
name = "bench/echo"
endpoints = ["/v1/chat/completions"]
slots = 1
concurrency = {concurrency}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "echo" }}
"""


def write_records(path: Path, count: int, workload: str = "plain") -> None:
    rng = random.Random(20)
    with open(path, "wb") as out:
        for i in range(count):
            if workload == "shared":
                system = rng.choices(SYSTEM_PROMPTS, weights=(8, 4, 2, 1))[0]
            else:
                system = "You are a concise assistant."
            out.write(orjson.dumps({
                "custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "bench/echo", "max_tokens": 64, "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Summarise item {i} of the nightly report in one line."}]},
            }) + b"\n")


def _system_prompt(topic: str, rules: int) -> str:
    """A long system prompt: a role, numbered rules and a worked example, 1 to 4 KB like real extraction prompts."""
    lines = [f"You are an assistant that reviews {topic} for a compliance team. Follow every rule below."]
    lines += [f"Rule {n}: when the {topic} mention a date, an amount or a party, quote it exactly and say where "
              f"it appears; never guess a value that is not written (rule {n} of {rules})." for n in range(rules)]
    lines.append('Answer as JSON: {"summary": "...", "parties": [...], "amounts": [...], "flags": [...]}.')
    return "\n".join(lines)


SYSTEM_PROMPTS = [_system_prompt("supplier contracts", 24), _system_prompt("expense reports", 16),
                  _system_prompt("support tickets", 10), _system_prompt("press releases", 6)]


def orjson_parse_seconds(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb") as handle:
        for raw in handle:
            orjson.loads(raw)
    return time.perf_counter() - start


def peak_rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def upload(server: Server, path: Path) -> str:
    with open(path, "rb") as handle:
        answer = server.http("POST", "/files", files={"file": (path.name, handle)}, data={"purpose": "batch"})
    answer.raise_for_status()
    return answer.json()["id"]


def create(server: Server, file_id: str, client: httpx.Client | None = None) -> tuple[float, dict]:
    """``POST /v1/batches`` timed; with ``client``, over its kept-alive connection (a fresh httpx client costs
    about 40 ms of its own before the request is sent, its TLS context, even for http)."""
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    if client is None:
        start = time.perf_counter()
        answer = server.http("POST", "/batches", json=body)
    else:
        start = time.perf_counter()
        answer = client.post("/batches", json=body)
    elapsed = time.perf_counter() - start
    answer.raise_for_status()
    return elapsed, answer.json()


def wait_completed(server: Server, batch_id: str) -> None:
    while True:
        batch = server.http("GET", f"/batches/{batch_id}").json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            assert batch["status"] == "completed", batch
            assert batch["request_counts"]["completed"] == batch["request_counts"]["total"], batch
            return
        time.sleep(0.5)  # slow polls: the engine's own clock times the run, not this loop


def engine_rate(engine_root: str, expected: int) -> float:
    """Requests per second as the engine saw them: from the first request's arrival to the last answer."""
    stats = httpx.get(f"{engine_root}/control/stats", timeout=10).json()
    assert stats["requests"] == expected, stats
    return expected / (stats["last_at"] - stats["first_at"])


def reset_engine(engine_root: str) -> None:
    httpx.post(f"{engine_root}/control/reset", timeout=10).raise_for_status()


async def direct_client_seconds(engine_url: str, path: Path, concurrency: int) -> float:
    """The baseline: a plain asyncio client doing the same job as the batch's worker, minus the service: read
    each record of the file, send its body (model renamed) with aiohttp, the usual asyncio HTTP client, at the
    same concurrency, parse each answer."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers={"content-type": "application/json"}) as client:
        with open(path, "rb") as handle:
            lines = iter(handle)

            async def lane() -> None:
                for raw in lines:
                    body = orjson.loads(raw)["body"]
                    data = orjson.dumps({**body, "model": "echo"})
                    async with client.post(f"{engine_url}/chat/completions", data=data) as response:
                        orjson.loads(await response.read())

            start = time.perf_counter()
            await asyncio.gather(*(lane() for _ in range(concurrency)))
            return time.perf_counter() - start


async def direct_pyreqwest_seconds(engine_url: str, path: Path, concurrency: int) -> float:
    """The same direct client with pyreqwest, the HTTP client the worker uses: how much the service itself costs
    next to its own client used bare."""
    client = (ClientBuilder().max_connections(concurrency).default_headers({"content-type": "application/json"})
              .no_proxy().build())
    async with client:
        with open(path, "rb") as handle:
            lines = iter(handle)

            async def lane() -> None:
                for raw in lines:
                    body = orjson.loads(raw)["body"]
                    data = orjson.dumps({**body, "model": "echo"})
                    response = await client.post(f"{engine_url}/chat/completions").body_bytes(data).build().send()
                    orjson.loads((await response.bytes()).to_bytes())

            start = time.perf_counter()
            await asyncio.gather(*(lane() for _ in range(concurrency)))
            return time.perf_counter() - start


def bench_create(work: Path, engine_url: str, args: argparse.Namespace, workload: str) -> None:
    """Creates of one workload, on a server of their own (so its peak memory is theirs alone)."""
    catalog = work / f"catalog-{workload}.toml"
    catalog.write_text(CATALOG.format(engine=engine_url, concurrency=args.concurrency))
    data = work / f"data-{workload}"
    data.mkdir()
    server = Server(data_dir=data, database_url=f"sqlite:///{data / 'openrelay.db'}", port=free_port(), env={},
                    args=["--catalog", str(catalog), "--no-worker"])  # no run competes with the creates
    try:
        server.start()
        big = work / f"create-{workload}.jsonl"
        write_records(big, args.records, workload)
        parses = [orjson_parse_seconds(big)]
        file_id = upload(server, big)
        rss_before, _ = peak_rss_mib(server.proc.pid)
        creates = []
        client = httpx.Client(base_url=server.base_url, headers={"authorization": f"Bearer {server.api_key}"},
                              timeout=600)
        for attempt in range(args.repeat + 1):  # the first (not timed) makes the connection and warms the server
            parses.append(orjson_parse_seconds(big))
            elapsed, batch = create(server, file_id, client)
            if attempt:
                creates.append(elapsed)
            assert batch["request_counts"]["total"] == args.records and batch["rejected_count"] == 0
        client.close()
        _, hwm = peak_rss_mib(server.proc.pid)
    finally:
        server.stop()
    create_s, parse = min(creates), min(parses)
    print(f"create ({workload}): {args.records:,} records ({big.stat().st_size / 1e6:.1f} MB), best of "
          f"{args.repeat}: {create_s:.3f} s over HTTP; orjson parse of the same lines {parse:.3f} s; "
          f"ratio {create_s / parse:.2f}x (goal <= 1x)")
    print(f"  server RSS: {rss_before:.0f} MiB before the creates, peak {hwm:.0f} MiB (VmHWM) after them")


def bench_throughput(work: Path, engine_url: str, args: argparse.Namespace) -> None:
    catalog = work / "catalog.toml"
    catalog.write_text(CATALOG.format(engine=engine_url, concurrency=args.concurrency))
    data = work / "data"
    data.mkdir()
    server = Server(data_dir=data, database_url=f"sqlite:///{data / 'openrelay.db'}", port=free_port(), env={},
                    args=["--catalog", str(catalog)])
    try:
        server.start()
        small = work / "run.jsonl"
        write_records(small, args.run_records)
        small_id = upload(server, small)
        ours, theirs, bare = [], [], []
        root = engine_url.removesuffix("/v1")
        for _ in range(args.pairs):  # alternate, so drift in the machine's speed hits all three alike
            reset_engine(root)  # nothing else talks to the engine now: the previous run has completed
            _, batch = create(server, small_id)
            wait_completed(server, batch["id"])
            ours.append(engine_rate(root, args.run_records))
            reset_engine(root)
            asyncio.run(direct_client_seconds(engine_url, small, args.concurrency))
            theirs.append(engine_rate(root, args.run_records))
            reset_engine(root)
            asyncio.run(direct_pyreqwest_seconds(engine_url, small, args.concurrency))
            bare.append(engine_rate(root, args.run_records))
    finally:
        server.stop()
    print(f"throughput at concurrency {args.concurrency}, {args.run_records:,} records, {args.pairs} rounds:")
    for name, runs in (("batch", ours), ("direct aiohttp client", theirs), ("direct pyreqwest client", bare)):
        print(f"  {name}: best {max(runs):,.0f} req/s, median {statistics.median(runs):,.0f}; all runs "
              f"{', '.join(f'{x:,.0f}' for x in runs)}")
    for name, runs in (("direct aiohttp client (goal >= 0.9)", theirs), ("direct pyreqwest client", bare)):
        paired = [a / b for a, b in zip(ours, runs, strict=True)]
        print(f"  batch / {name}: median of the paired ratios {statistics.median(paired):.2f}, "
              f"ratio of the bests {max(ours) / max(runs):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000, help="records in the create benchmark file")
    parser.add_argument("--run-records", type=int, default=20_000, help="records in the throughput batch")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="creates (and parses) timed; the best counts")
    parser.add_argument("--pairs", type=int, default=6, help="rounds of throughput runs (batch, then each client)")
    parser.add_argument("--workload", choices=("plain", "shared", "both"), default="both",
                        help="records of the create benchmark: short and unshared, long shared system prompts")
    parser.add_argument("--create-only", action="store_true", help="time the creates, not the throughput")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orl-bench-"))
    engine_proc, engine_url = start_test_engine("--no-record")
    try:
        for workload in ("plain", "shared") if args.workload == "both" else (args.workload,):
            bench_create(work, engine_url, args, workload)
        if not args.create_only:
            bench_throughput(work, engine_url, args)
    finally:
        stop_test_engine(engine_proc)
        if os.environ.get("KEEP_BENCH_DIR") is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
