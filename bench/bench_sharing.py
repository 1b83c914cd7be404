"""Benchmark for issue 33 part 4: interactive chat traffic sent straight to an engine, alone and beside batch work,
and the batch's records/s against the batch alone.

    nice -n -10 .venv/bin/python bench/bench_sharing.py [--quick] [--engines test,llama] [--seconds 60]

Interactive traffic, the same arrivals in every setup (``--seed``): ``steady``, one chat request every ~1.5 s (each
gap drawn from 0.5x to 1.5x the mean); ``bursts``, cycles of ``--busy`` seconds with a request every ~``burst
every`` (the engine's) then ``--quiet`` seconds of none. Each runs for ``--seconds`` (whole cycles for bursts) in
these setups: alone; beside a plain client that keeps ``--concurrency`` (the engine's slots) requests of batch
records in flight; beside an OpenRelay batch of those records at ``concurrency = --concurrency``, through `orl serve
--no-worker` and one `orl worker` (SQLite), first without the engine-sharing knobs, then with ``load_metrics`` (and
``yield_to_interactive``'s default, true), then with ``engine_priority = 1`` where the engine schedules by priority.
The batch is started first and measured once it has completed ``--concurrency`` records; it is big enough to outlast
the window and is cancelled after it. "solo" is the same batch with no interactive traffic, over as long a window.

Engines: the test engine (tests/support/test_engine.py) as vLLM would serve: ``--slots 4``, a waiting queue,
``--scheduling priority --preempt`` (the body's ``priority``, lower first, interactive at the default 0),
``--metrics-dialect vllm``, and a service time (``--decode-seconds``, plus ``--prefill-seconds-per-token`` of the
prompt); llama.cpp's llama-server on SmolLM2-135M (``--metrics``, 4 slots, ``--llama-threads``, no host-memory
prompt cache, so that the prompts every setup sends again are computed again; built by
scripts/setup.sh, skipped with a message if it is not), which has no priority scheduling.

Printed per setup: the interactive requests' p50 and p90 latency (sent to answered, client side) and p90 against
alone's; the background's records/s over the window (answers of the plain client; the batch's
``request_counts.completed``, read at both ends) and the batch's against solo; for the test engine, the
preemptions. Then the issue's goals, each met or not: with load metrics, bursts' p90 within 1.5x of alone and the
batch at >= 0.7 of solo; with engine priority, p90 within 1.2x of alone. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.llama_cpp_server import (  # noqa: E402
    llama_server_binary,
    start_llama_cpp_server,
    stop_llama_cpp_server,
)
from tests.support.server import Server, free_port  # noqa: E402
from tests.support.test_engine import start_test_engine, stop_test_engine  # noqa: E402
from tests.support.workers import WorkerProcess  # noqa: E402

MODEL = "bench/shared"
CATALOG = """
[[models]]
name = "{model}"
endpoints = ["/v1/chat/completions"]
slots = 1
concurrency = {concurrency}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
[models.engine]
kind = "openai"
base_url = "{url}"
served_model = "{served}"
timeout_seconds = 600
{knobs}
"""
# Whether this tree has issue 33's engine-sharing knobs (without them a catalog's unknown keys are ignored).
KNOBS = importlib.util.find_spec("openrelay.engines.load_metrics") is not None
WORDS = ("river bridge stone market orchard apple harvest winter summer school teacher library book map road farm "
         "mill water tower bell clock square garden tree field hill valley town council record spring festival "
         "music boat harbour storm rain snow station train engine wool cloth").split()


# -- engines ------------------------------------------------------------------------------------------------------


@dataclass
class Engine:
    name: str
    url: str  # .../v1
    served: str
    dialect: str  # its load_metrics
    load_names: tuple[str, str]  # its gauges of requests running and waiting
    burst_every: float  # seconds between interactive requests while busy
    max_rate: float  # records/s it cannot exceed: sizes the batch
    priority: bool  # schedules by the body's priority
    stop: Callable[[], None]
    stats_url: str | None = None  # the test engine's /control/stats

    async def load(self, session: aiohttp.ClientSession) -> int:
        """Requests running and waiting on the engine, every client's."""
        async with session.get(self.url.removesuffix("/v1") + "/metrics") as response:
            text = await response.text()
        return round(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.split("{")[0].split(" ")[0] in self.load_names))

    def preemptions(self) -> int | None:
        return None if self.stats_url is None else httpx.get(self.stats_url, timeout=10).json()["preemptions"]


def start_test(args: argparse.Namespace) -> Engine:
    simulation = ["--slots", str(args.concurrency), "--scheduling", "priority", "--preempt", "--metrics-dialect",
                  "vllm", "--decode-seconds", str(args.decode_seconds), "--prefill-seconds-per-token",
                  str(args.prefill_seconds_per_token)]
    proc, url = start_test_engine("--no-record", *simulation)
    print(f"\ntest engine ({' '.join(simulation)})", flush=True)
    return Engine("test engine", url, "echo", "vllm", ("vllm:num_requests_running", "vllm:num_requests_waiting"),
                  burst_every=0.4, max_rate=args.concurrency / args.decode_seconds, priority=True,
                  stop=lambda: stop_test_engine(proc), stats_url=url.removesuffix("/v1") + "/control/stats")


def start_llama(args: argparse.Namespace, work: Path) -> Engine | None:
    if not llama_server_binary().exists():
        print(f"\nllama-server: skipped, {llama_server_binary()} is not built (scripts/setup.sh builds it)")
        return None
    proc, url = start_llama_cpp_server(free_port(), work / "llama-server.log", parallel=args.concurrency,
                                       ctx_per_slot=512, threads=args.llama_threads,
                                       cache_ram_mib=0)  # no host prompt cache: a prompt seen before is not free
    print(f"\nllama-server (SmolLM2-135M, {args.concurrency} slots, {args.llama_threads} threads, --metrics)",
          flush=True)
    return Engine("llama-server", url, "smollm2", "llama.cpp",
                  ("llamacpp:requests_processing", "llamacpp:requests_deferred"), burst_every=0.5, max_rate=40,
                  priority=False, stop=lambda: stop_llama_cpp_server(proc))


# -- traffic ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    name: str
    every: float  # mean seconds between requests while busy
    busy: float  # seconds of requests per cycle
    quiet: float  # seconds of none after them

    def arrivals(self, seconds: float, seed: int) -> list[float]:
        rng, times, t, cycle = random.Random(seed), [], 0.0, self.busy + self.quiet
        while t < seconds:
            if t % cycle < self.busy:
                times.append(t)
                t += self.every * rng.uniform(0.5, 1.5)
            else:
                t += cycle - t % cycle
        return times


def interactive_body(engine: Engine, i: int, max_tokens: int) -> bytes:
    return orjson.dumps({"model": engine.served, "max_tokens": max_tokens, "temperature": 0, "messages": [
        {"role": "user", "content": f"Say one sentence about the {WORDS[i % len(WORDS)]}, please (visit {i})."}]})


def batch_record(i: int, words: int, max_tokens: int) -> dict:
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": [
        {"role": "system", "content": "Summarize the notes you are given in one sentence."},
        {"role": "user", "content": f"Notes {i}: {text}"}]}


async def interactive(session: aiohttp.ClientSession, engine: Engine, times: list[float],
                      max_tokens: int) -> list[float]:
    """Sends a request at each of ``times`` (seconds from now) whatever the answers before it; their latencies."""
    start = time.monotonic()

    async def one(i: int, at: float) -> float:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        sent = time.monotonic()
        async with session.post(f"{engine.url}/chat/completions", data=interactive_body(engine, i, max_tokens),
                                headers={"content-type": "application/json"}) as response:
            await response.read()
            assert response.status == 200, await response.text()
        return time.monotonic() - sent

    return list(await asyncio.gather(*(one(i, at) for i, at in enumerate(times))))


# -- what runs beside it ------------------------------------------------------------------------------------------


@dataclass
class Background:
    """Nothing (alone), a plain client, or an OpenRelay batch; ``done()`` counts its records answered."""

    label: str
    kind: str  # none, plain, batch
    knobs: str = ""  # the batch's engine-table lines
    answered: int = 0
    lanes: list[asyncio.Task] = field(default_factory=list)
    relay: tuple[Server, WorkerProcess] | None = None
    batch_id: str = ""

    async def start(self, session: aiohttp.ClientSession, engine: Engine, args: argparse.Namespace, work: Path,
                    records: Path) -> None:
        """Starts it and returns once it has answered ``--concurrency`` records."""
        if self.kind == "plain":
            async def lane(n: int) -> None:
                for i in range(n, 1 << 30, args.concurrency):  # records of their own: none found in a cache
                    body = {**batch_record(-1 - i, args.batch_words, args.max_tokens), "model": engine.served}
                    async with session.post(f"{engine.url}/chat/completions", data=orjson.dumps(body),
                                            headers={"content-type": "application/json"}) as response:
                        await response.read()
                    self.answered += 1

            self.lanes = [asyncio.create_task(lane(n)) for n in range(args.concurrency)]
        elif self.kind == "batch":
            self.relay = await asyncio.to_thread(start_relay, engine, args, work, self.knobs)
            self.batch_id = await asyncio.to_thread(create_batch, self.relay[0], records)
        deadline = time.monotonic() + 120
        while self.kind != "none" and await self.done() < args.concurrency:
            assert time.monotonic() < deadline, f"{self.label}: no records answered in 120 s"
            await asyncio.sleep(0.1)

    async def done(self) -> int:
        if self.relay is None:
            return self.answered
        batch = (await asyncio.to_thread(self.relay[0].http, "GET", f"/batches/{self.batch_id}")).json()
        assert batch["request_counts"]["failed"] == 0, batch
        return batch["request_counts"]["completed"]

    async def stop(self) -> None:
        for task in self.lanes:
            task.cancel()
        await asyncio.gather(*self.lanes, return_exceptions=True)
        if self.relay is not None:
            server, worker = self.relay
            await asyncio.to_thread(server.http, "POST", f"/batches/{self.batch_id}/cancel")
            await asyncio.to_thread(worker.stop)
            await asyncio.to_thread(server.stop)


def start_relay(engine: Engine, args: argparse.Namespace, work: Path, knobs: str) -> tuple[Server, WorkerProcess]:
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    catalog = data / "catalog.toml"
    catalog.write_text(CATALOG.format(model=MODEL, concurrency=args.concurrency, url=engine.url,
                                      served=engine.served, knobs=knobs))
    env = {"OPENRELAY_TICK_SECONDS": "0.05"}
    server = Server(data_dir=data, database_url=f"sqlite:///{data / 'openrelay.db'}", port=free_port(), env=env,
                    args=["--no-worker", "--catalog", str(catalog)]).start()
    worker = WorkerProcess(data_dir=data, database_url=server.database_url, catalog=catalog,
                           log_path=data / "worker.log", env=env, serving=MODEL)
    return server, worker


def create_batch(server: Server, records: Path) -> str:
    with open(records, "rb") as handle:
        uploaded = server.http("POST", "/files", files={"file": (records.name, handle)}, data={"purpose": "batch"})
    uploaded.raise_for_status()
    answer = server.http("POST", "/batches", json={"input_file_id": uploaded.json()["id"],
                                                   "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    answer.raise_for_status()
    return answer.json()["id"]


# -- one engine's runs --------------------------------------------------------------------------------------------


@dataclass
class Row:
    p50: float | None
    p90: float | None
    rate: float | None  # the background's records/s
    preemptions: int | None


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


async def run_setup(engine: Engine, background: Background, traffic: Traffic | None, seconds: float,
                    args: argparse.Namespace, work: Path, records: Path) -> Row:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        preempted = engine.preemptions()
        try:
            await background.start(session, engine, args, work, records)
            start, done = time.monotonic(), await background.done()
            if traffic is None:
                await asyncio.sleep(seconds)
                latencies = []
            else:
                latencies = await interactive(session, engine, traffic.arrivals(seconds, args.seed), args.max_tokens)
            rate = (await background.done() - done) / (time.monotonic() - start)
        finally:
            await background.stop()
        while await engine.load(session):  # what the background left on the engine ends before the next setup
            await asyncio.sleep(0.1)
    return Row(percentile(latencies, 0.5) if latencies else None, percentile(latencies, 0.9) if latencies else None,
               rate if background.kind != "none" else None,
               None if preempted is None else engine.preemptions() - preempted)


def backgrounds(engine: Engine, concurrency: int) -> list[Background]:
    chosen = [Background("alone", "none"), Background(f"plain client, {concurrency} at once", "plain"),
              Background("OpenRelay batch", "batch")]
    if not KNOBS:
        return chosen
    knob = f'load_metrics = "{engine.dialect}"'
    chosen.append(Background(f"batch, {knob}", "batch", knob))
    if engine.priority:
        chosen.append(Background("batch, engine_priority = 1", "batch", "engine_priority = 1"))
    return chosen


def bench_engine(engine: Engine, args: argparse.Namespace, work: Path) -> None:
    records = work / f"{engine.served}.jsonl"
    count = int(engine.max_rate * (args.seconds + 60))
    records.write_bytes(b"".join(orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                               "body": batch_record(i, args.batch_words, args.max_tokens)}) + b"\n"
                                 for i in range(count)))
    cycle = args.busy + args.quiet
    traffics = [Traffic("steady", 1.5, busy=args.seconds, quiet=0.0),
                Traffic("bursts", engine.burst_every, busy=args.busy, quiet=args.quiet)]
    windows = {"steady": args.seconds, "bursts": max(1, round(args.seconds / cycle)) * cycle}
    solo = asyncio.run(run_setup(engine, Background("batch solo", "batch"), None, args.seconds, args, work,
                                 records)).rate
    assert solo
    print(f"  batch solo (concurrency {args.concurrency}, no interactive traffic): {solo:.2f} records/s over "
          f"{args.seconds:.0f} s", flush=True)
    rows: dict[tuple[str, str], Row] = {}
    for traffic in traffics:
        print(f"  {traffic.name} ({len(traffic.arrivals(windows[traffic.name], args.seed))} requests over "
              f"{windows[traffic.name]:.0f} s):", flush=True)
        for background in backgrounds(engine, args.concurrency):
            row = rows[traffic.name, background.label] = asyncio.run(run_setup(
                engine, background, traffic, windows[traffic.name], args, work, records))
            alone = rows[traffic.name, "alone"]
            assert row.p50 is not None and row.p90 is not None and alone.p90 is not None
            text = (f"    {background.label:<36} p50 {row.p50:6.3f} s  p90 {row.p90:6.3f} s "
                    f"({row.p90 / alone.p90:5.2f}x alone)")
            if row.rate is not None:
                text += f"  {row.rate:6.2f} records/s"
                if background.kind == "batch":
                    text += f" ({row.rate / solo:.2f} of solo)"
            if row.preemptions:
                text += f"  preemptions {row.preemptions}"
            print(text, flush=True)
    for (traffic, label), row in rows.items():  # the goals: load metrics in bursts, priority throughout
        if ("load_metrics" in label and traffic == "bursts") or "engine_priority" in label:
            ratio = row.p90 / rows[traffic, "alone"].p90  # type: ignore[operator]
            goal = 1.2 if "engine_priority" in label else 1.5
            text = (f"  goal, {traffic}, {label}: p90 {ratio:.2f}x alone "
                    f"(<= {goal}: {'met' if ratio <= goal else 'NOT met'})")
            if "load_metrics" in label:
                share = row.rate / solo  # type: ignore[operator]
                text += f"; batch {share:.2f} of solo (>= 0.7: {'met' if share >= 0.7 else 'NOT met'})"
            print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="test,llama", help="comma-separated: test, llama")
    parser.add_argument("--quick", action="store_true", help="a few seconds per setup: --seconds 6 --busy 2 --quiet 4")
    parser.add_argument("--seconds", type=float, default=60.0, help="each setup's window")
    parser.add_argument("--busy", type=float, default=5.0, help="seconds of each burst")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds of quiet after each burst")
    parser.add_argument("--concurrency", type=int, default=4, help="the engines' slots, the batch's and the plain "
                        "client's concurrency")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--batch-words", type=int, default=30, help="words of each batch record's notes")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--decode-seconds", type=float, default=0.5, help="the test engine's, per request")
    parser.add_argument("--prefill-seconds-per-token", type=float, default=0.0005, help="the test engine's")
    # One thread: llama.cpp's threads wait on each other whenever one is preempted, and this machine's 2 cores are
    # shared with orl serve, orl worker and the clients.
    parser.add_argument("--llama-threads", type=int, default=1)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.busy, args.quiet = 6.0, 2.0, 4.0
    if not KNOBS:
        print("this tree has no load_metrics / engine_priority (issue 33): only the setups without them run")
    work = Path(tempfile.mkdtemp(prefix="orl-bench-sharing-"))
    try:
        for name in args.engines.split(","):
            if name not in ("test", "llama"):
                parser.error(f"unknown engine {name!r}")
            engine = start_test(args) if name == "test" else start_llama(args, work)
            if engine is None:
                continue
            try:
                bench_engine(engine, args, work)
            finally:
                engine.stop()
    finally:
        if os.environ.get("KEEP_BENCH_DIR") is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
