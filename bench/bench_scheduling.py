"""Benchmark for issue 20: a shuffled shared-prefix workload through `orl serve` vs a plain client that sends the same
records in input order at the same concurrency, against the same engine, which keeps a prefix cache.

    .venv/bin/python bench/bench_scheduling.py [--engines test,llama] [--concurrency 16] [--rounds 2] [--restart]
        [--ungrouped] [--auto] [--sweep 4,8,16,32] [--replicas] [--batches-only]

The workload: one long system prompt shared by every record, ``--documents`` long documents with ``--questions``
questions each (records ``doc{d}-q{q}``: system prompt, then the document, then the question), in random order
(``--seed``). Each engine starts with a cache smaller than the documents' total: the test engine
(tests/support/engine_simulation.py) with ``--cache-blocks`` blocks of 64 words and a service time that a cached
prefix shortens; llama.cpp's llama-server on SmolLM2 (built by scripts/setup.sh; skipped with a message if it is
not) with ``--llama-parallel`` slots and no host-memory prompt cache, so it holds only what its slots hold. Every
run starts on a fresh engine (test engine reset; llama-server restarted on the same port).

Workloads, each against the plain client at the same concurrency, run in pairs back to back in alternating order
(``--rounds``): ``batch`` (always), a catalog with ``concurrency = N`` and prefix grouping on (the default);
``--ungrouped``, the same with ``prefix_grouping = false``; ``--auto``, ``concurrency = "auto"`` up to
``--auto-max``, where the test engine has a knee (``--knee``) and answers 429 past ``--max-in-flight``;
``--sweep``, fixed concurrencies; ``--replicas``, two engine processes in ``base_urls`` (the plain client takes
them in turn). ``--restart`` stops and starts `orl serve` (same store) before each round after the first, so that
those rounds run on fresh worker processes (with ``"auto"``, limiters that start from what the store kept);
``--batches-only`` leaves the plain client out, to compare ``"auto"`` with the sweep in less time. A
workload the tree cannot serve yet (a catalog field not understood) is reported and skipped.

Per run: wall seconds (the client's: from creating the batch until it is seen completed, polling every 50 ms, 500
ms for llama-server, or from the plain client's first request to its last answer), prompt tokens/s, output
tokens/s, the share of prompt tokens the engine served from its cache (the answers'
``usage.prompt_tokens_details.cached_tokens``), the test engine's 429s; then each workload's median ratio of wall
times against the plain client's; with ``--auto`` and ``--sweep``, each round of ``"auto"`` against the best fixed
concurrency of the sweep (its median wall time / the round's) and the requests answered 429. Nothing is asserted on
time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

MODEL = "bench/prefixed"
CATALOG = """
[[models]]
name = "{model}"
endpoints = ["/v1/chat/completions"]
slots = 1
{concurrency}
prefix_grouping = {grouping}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
[models.engine]
kind = "openai"
{urls}
served_model = "{served}"
timeout_seconds = 600
"""
WORDS = ("river bridge stone market orchard apple harvest winter summer school teacher student library book map "
         "road cart farm barn cider honey bread mill wheel water tower bell clock square street garden tree leaf "
         "field hill valley town city council mayor record year month spring autumn festival music choir boat "
         "harbour fish net rope sail storm wind rain snow frost road station train ticket engine coal iron steel "
         "wool cloth dye colour red blue green white black north south east west old new small large long short "
         "first last early late open closed built planted rebuilt moved sold bought carried held kept").split()


# -- the workload -----------------------------------------------------------------------------------------------


def prose(rng: random.Random, words: int) -> str:
    """``words`` words of sentences made from a fixed vocabulary: deterministic for a seed."""
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        out += [sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."]
    return " ".join(out[:words])


def write_workload(path: Path, *, documents: int, questions: int, system_words: int, document_words: int,
                   max_tokens: int, seed: int) -> int:
    """The shuffled shared-prefix records as batch input lines; returns how many."""
    rng = random.Random(seed)
    system = "You answer questions about the document the user gives. " + prose(rng, system_words)
    texts = [prose(rng, document_words) for _ in range(documents)]
    records = []
    for d, text in enumerate(texts):
        for q in range(questions):
            question = f"Question {q}: what does the document say about the {rng.choice(WORDS)}?"
            records.append({"custom_id": f"doc{d}-q{q}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": [
                                {"role": "system", "content": system},
                                {"role": "user", "content": f"Document {d}:\n{text}\n\n{question}"}]}})
    rng.shuffle(records)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return len(records)


# -- engines: a fresh one for every run -------------------------------------------------------------------------


class TestEngines:
    """One or more test engine processes with the bench's simulation; ``fresh()`` resets them (empty caches)."""

    name = "test engine"
    served = "echo"

    def __init__(self, replicas: int, simulation: list[str]) -> None:
        self.procs, self.urls = [], []
        for _ in range(replicas):
            proc, url = start_test_engine("--no-record", *simulation)
            self.procs.append(proc)
            self.urls.append(url)

    def fresh(self) -> None:
        for url in self.urls:
            httpx.post(url.removesuffix("/v1") + "/control/reset", timeout=10).raise_for_status()

    def too_many_requests(self) -> int:
        return sum(stats["too_many_requests"] for stats in self._stats())

    def span(self) -> tuple[float, float] | None:
        """Wall-clock seconds of the first request's arrival and of the last answer, over the replicas."""
        stats = [s for s in self._stats() if s["first_at"] is not None]
        return (min(s["first_at"] for s in stats), max(s["last_at"] for s in stats)) if stats else None

    def _stats(self) -> list[dict[str, Any]]:
        return [httpx.get(url.removesuffix("/v1") + "/control/stats", timeout=10).json() for url in self.urls]

    def close(self) -> None:
        for proc in self.procs:
            stop_test_engine(proc)


class LlamaEngines:
    """One or more llama-servers on SmolLM2; ``fresh()`` restarts them on the same ports (empty slots)."""

    name = "llama-server"
    served = "smollm2"

    def __init__(self, replicas: int, work: Path, start: Callable[[int, Path], Any]) -> None:
        self.start = start
        self.ports = [free_port() for _ in range(replicas)]
        self.logs = [work / f"llama-server-{i}.log" for i in range(replicas)]
        self.urls = [f"http://127.0.0.1:{port}/v1" for port in self.ports]
        self.procs: list[Any] = []
        self.fresh()

    def fresh(self) -> None:
        self.close()
        self.procs = [self.start(port, log)[0] for port, log in zip(self.ports, self.logs, strict=True)]

    def too_many_requests(self) -> int:
        return 0  # llama-server queues what its slots cannot take

    def span(self) -> tuple[float, float] | None:
        return None  # llama-server does not say when its first request came

    def close(self) -> None:
        for proc in self.procs:
            stop_llama_cpp_server(proc)
        self.procs = []


Engines = TestEngines | LlamaEngines


# -- the two clients --------------------------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    records: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    too_many_requests: int = 0
    started: float = 0.0  # wall clock (time.time) of the create, or of the plain client's first request
    ended: float = 0.0  # ... and of seeing the batch completed, or of the plain client's last answer
    engine_span: tuple[float, float] | None = None  # the engine's first request and last answer (test engine)

    def line(self, label: str) -> str:
        share = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        text = (f"    {label:<34} {self.seconds:7.2f} s  {self.prompt_tokens / self.seconds:9,.0f} prompt tok/s  "
                f"{self.output_tokens / self.seconds:7,.0f} output tok/s  cached {share:6.1%}  "
                f"429s {self.too_many_requests}")
        if self.engine_span is not None and self.started:
            first, last = self.engine_span
            text += (f"  (engine busy {last - first:.2f} s: {first - self.started:.2f} s before its first request, "
                     f"{self.ended - last:.2f} s after its last answer)")
        return text


def add_usage(totals: list[int], usage: dict[str, Any]) -> None:
    totals[0] += usage.get("prompt_tokens", 0)
    totals[1] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    totals[2] += usage.get("completion_tokens", 0)


async def direct_client(urls: list[str], path: Path, concurrency: int, served: str) -> Run:
    """The baseline: read each record in input order, send its body (model renamed) with aiohttp at the same
    concurrency, the engines taken in turn, retrying a 429 after 50 ms; sum the answers' usage."""
    totals = [0, 0, 0]
    records = 0
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"content-type": "application/json"}) as client:
        lines = enumerate(path.read_bytes().splitlines())

        async def lane() -> None:
            nonlocal records
            for i, raw in lines:
                data = orjson.dumps({**orjson.loads(raw)["body"], "model": served})
                while True:
                    async with client.post(f"{urls[i % len(urls)]}/chat/completions", data=data) as response:
                        answer = orjson.loads(await response.read())
                    if response.status != 429:
                        break
                    await asyncio.sleep(0.05)
                assert response.status == 200, answer
                add_usage(totals, answer["usage"])
                records += 1

        started, start = time.time(), time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        seconds = time.perf_counter() - start
    return Run(seconds, records, *totals, started=started, ended=time.time())


def batch_run(server: Server, file_id: str, poll_seconds: float) -> Run:
    started, start = time.time(), time.perf_counter()
    answer = server.http("POST", "/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                   "completion_window": "24h"})
    answer.raise_for_status()
    batch_id = answer.json()["id"]
    while (batch := server.http("GET", f"/batches/{batch_id}").json())["status"] not in (
            "completed", "failed", "expired", "cancelled"):
        time.sleep(poll_seconds)
    seconds, ended = time.perf_counter() - start, time.time()
    assert batch["status"] == "completed", batch
    assert batch["request_counts"]["completed"] == batch["request_counts"]["total"], batch
    totals = [0, 0, 0]
    content = server.http("GET", f"/files/{batch['output_file_id']}/content").content
    for raw in content.splitlines():
        add_usage(totals, orjson.loads(raw)["response"]["body"]["usage"])
    return Run(seconds, batch["request_counts"]["completed"], *totals, started=started, ended=ended)


# -- workloads ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    label: str
    concurrency: int  # the plain client's, and the batch's unless auto
    auto_max: int | None = None  # concurrency = "auto" up to this
    grouping: bool = True
    replicas: int = 1

    def catalog(self, engines: Engines) -> str:
        if self.auto_max is None:
            concurrency = f"concurrency = {self.concurrency}"
        else:
            concurrency = f'concurrency = "auto"\nmin_concurrency = 1\nmax_concurrency = {self.auto_max}'
        urls = (f'base_url = "{engines.urls[0]}"' if len(engines.urls) == 1
                else "base_urls = [" + ", ".join(f'"{u}"' for u in engines.urls) + "]")
        return CATALOG.format(model=MODEL, concurrency=concurrency, grouping=str(self.grouping).lower(), urls=urls,
                              served=engines.served)


def start_server(work: Path, catalog: str) -> Server:
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    (data / "catalog.toml").write_text(catalog)
    server = Server(data_dir=data, database_url=f"sqlite:///{data / 'openrelay.db'}", port=free_port(),
                    env={"OPENRELAY_TICK_SECONDS": "0.05"}, args=["--catalog", str(data / "catalog.toml")])
    return server.start()


def run_workload(workload: Workload, engines: Engines, work: Path, path: Path, rounds: int,
                 poll_seconds: float, restart: bool = False, plain: bool = True) -> list[Run]:
    """Pairs of runs (batch, plain client) in alternating order; prints each run and the paired ratios of wall time
    (plain client / batch: above 1, the batch was faster); returns the batch runs, one a round. ``restart``: the
    server is stopped and started again (same store) before each round after the first, so that each of those
    rounds runs on a worker process of its own, which starts from what the store kept of the last one. ``plain``
    False: the batch runs alone (for comparing batches with one another: ``"auto"`` against the sweep)."""
    print(f"  {workload.label}:", flush=True)
    try:
        server = start_server(work, workload.catalog(engines))
    except RuntimeError as exc:  # a catalog field this tree does not know yet
        reason = str(exc).strip().splitlines()
        print(f"    skipped: orl serve would not start on this catalog: {reason[-1] if reason else exc}")
        return []
    ratios = []
    batches = []
    try:
        with open(path, "rb") as handle:
            uploaded = server.http("POST", "/files", files={"file": (path.name, handle)}, data={"purpose": "batch"})
        uploaded.raise_for_status()
        for i in range(rounds):
            if restart and i:
                server.stop()
                server.start()
            runs: dict[str, Run] = {}
            sides = ("batch", "direct") if i % 2 == 0 else ("direct", "batch")
            for side in sides if plain else ("batch",):
                engines.fresh()
                if side == "batch":
                    run = batch_run(server, uploaded.json()["id"], poll_seconds)
                else:
                    run = asyncio.run(direct_client(engines.urls, path, workload.concurrency, engines.served))
                run.too_many_requests = engines.too_many_requests()
                run.engine_span = engines.span()
                runs[side] = run
            print(runs["batch"].line("orl serve batch"), flush=True)
            batches.append(runs["batch"])
            if plain:
                print(runs["direct"].line(f"plain client, input order, c={workload.concurrency}"), flush=True)
                ratios.append(runs["direct"].seconds / runs["batch"].seconds)
    finally:
        server.stop()
    if ratios:
        print(f"    plain client's wall time / the batch's: median {statistics.median(ratios):.2f} "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")
    return batches


def compare_auto(results: dict[Workload, list[Run]]) -> None:
    """With ``--auto`` and ``--sweep``: each round of ``"auto"`` against the swept concurrency whose batches had the
    lowest median wall time (the best fixed), and the share of its requests answered 429."""
    auto = next((runs for workload, runs in results.items() if workload.auto_max is not None and runs), None)
    swept = {workload.concurrency: runs for workload, runs in results.items()
             if workload.label.startswith("sweep") and runs}
    if auto is None or not swept:
        return
    best = min(swept, key=lambda n: statistics.median(run.seconds for run in swept[n]))
    best_seconds = statistics.median(run.seconds for run in swept[best])
    shares = ", ".join(f"{run.too_many_requests} of {run.records + run.too_many_requests}" for run in auto)
    print(f'  concurrency "auto" against the best fixed of the sweep ({best}, median {best_seconds:.2f} s): '
          f"{', '.join(f'{best_seconds / run.seconds:.2f}' for run in auto)} a round (its wall / auto's); "
          f"requests answered 429: {shares}")


def workloads(args: argparse.Namespace, concurrency: int) -> list[Workload]:
    chosen = [Workload(f"batch, concurrency {concurrency}, prefix grouping", concurrency)]
    if args.ungrouped:
        chosen.append(Workload(f"batch, concurrency {concurrency}, no prefix grouping", concurrency, grouping=False))
    if args.auto:
        chosen.append(Workload(f'batch, concurrency "auto" (1..{args.auto_max})', concurrency,
                               auto_max=args.auto_max))
    for n in args.sweep:
        chosen.append(Workload(f"sweep: batch, concurrency {n}", n))
    if args.replicas:
        chosen.append(Workload(f"two replicas, concurrency {concurrency}", concurrency, replicas=2))
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="test,llama", help="comma-separated: test, llama")
    parser.add_argument("--documents", type=int, default=10)
    parser.add_argument("--questions", type=int, default=24, help="per document")
    parser.add_argument("--system-words", type=int, default=300)
    parser.add_argument("--document-words", type=int, default=600)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs (batch, plain client) per workload")
    parser.add_argument("--concurrency", type=int, default=16, help="the test engine's runs")
    parser.add_argument("--ungrouped", action="store_true", help="also a batch with prefix_grouping = false")
    parser.add_argument("--auto", action="store_true", help='also a batch with concurrency = "auto"')
    parser.add_argument("--auto-max", type=int, default=128, help='max_concurrency of concurrency = "auto"')
    parser.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                        help="also batches at these fixed concurrencies, e.g. 4,8,16,32")
    parser.add_argument("--replicas", action="store_true", help="also two engine replicas in base_urls")
    parser.add_argument("--batches-only", action="store_true",
                        help="no plain client runs: compare the batches with one another (--auto with --sweep)")
    parser.add_argument("--restart", action="store_true",
                        help="restart orl serve (same store) before each round after the first")
    test = parser.add_argument_group("the test engine's simulation (tests/support/engine_simulation.py)")
    test.add_argument("--cache-blocks", type=int, default=48, help="of 64 words; the documents need about 100")
    test.add_argument("--prefill-seconds-per-token", type=float, default=0.0005)
    test.add_argument("--decode-seconds", type=float, default=0.05)
    test.add_argument("--knee", type=int, default=32)
    test.add_argument("--max-in-flight", type=int, default=64)
    llama = parser.add_argument_group("llama-server")
    # SmolLM2-135M computes 100-200 prompt tokens/s a thread here: a smaller workload of the same shape. One thread
    # leaves the other core to orl serve and the client (llama.cpp's threads wait on each other when one is preempted).
    llama.add_argument("--llama-parallel", type=int, default=2, help="slots; also the concurrency of its runs")
    llama.add_argument("--llama-threads", type=int, default=1)
    llama.add_argument("--llama-documents", type=int, default=8)
    llama.add_argument("--llama-questions", type=int, default=6, help="per document")
    llama.add_argument("--llama-system-words", type=int, default=60)
    llama.add_argument("--llama-document-words", type=int, default=300)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orl-bench-scheduling-"))
    try:
        for engine in args.engines.split(","):
            if engine == "test":
                bench_test_engine(args, work)
            elif engine == "llama":
                bench_llama_server(args, work)
            else:
                parser.error(f"unknown engine {engine!r}")
    finally:
        if os.environ.get("KEEP_BENCH_DIR") is None:
            shutil.rmtree(work, ignore_errors=True)


def bench_test_engine(args: argparse.Namespace, work: Path) -> None:
    path = work / "test-engine.jsonl"
    count = write_workload(path, documents=args.documents, questions=args.questions, system_words=args.system_words,
                           document_words=args.document_words, max_tokens=args.max_tokens, seed=args.seed)
    simulation = ["--cache-blocks", str(args.cache_blocks), "--block-tokens", "64",
                  "--prefill-seconds-per-token", str(args.prefill_seconds_per_token),
                  "--decode-seconds", str(args.decode_seconds), "--knee", str(args.knee),
                  "--max-in-flight", str(args.max_in_flight)]
    print(f"test engine ({' '.join(simulation)}): {count} records, {args.documents} documents x {args.questions} "
          f"questions, system prompt {args.system_words} words, documents {args.document_words} words")
    run_all(args, work, path, args.concurrency, 0.05, lambda replicas: TestEngines(replicas, simulation))


def bench_llama_server(args: argparse.Namespace, work: Path) -> None:
    if not llama_server_binary().exists():
        print(f"llama-server: skipped, {llama_server_binary()} is not built (scripts/setup.sh builds it)")
        return
    path = work / "llama-server.jsonl"
    count = write_workload(path, documents=args.llama_documents, questions=args.llama_questions,
                           system_words=args.llama_system_words, document_words=args.llama_document_words,
                           max_tokens=args.max_tokens, seed=args.seed)
    # A slot holds a prompt and its answer; the words of this vocabulary take about 1.2 tokens each.
    words = args.llama_system_words + args.llama_document_words + 40
    ctx = 256 * -(-int(words * 1.6 + args.max_tokens) // 256)

    def start(port: int, log: Path) -> Any:
        return start_llama_cpp_server(port, log, parallel=args.llama_parallel, ctx_per_slot=ctx,
                                      threads=args.llama_threads, cache_ram_mib=0)

    print(f"llama-server (SmolLM2-135M, {args.llama_parallel} slots of {ctx} tokens, {args.llama_threads} threads, "
          f"no host prompt cache): {count} records, {args.llama_documents} documents x {args.llama_questions} "
          f"questions, system prompt {args.llama_system_words} words, documents {args.llama_document_words} words, "
          f"max_tokens {args.max_tokens}")
    # Polls cost orl serve CPU, which llama.cpp's threads need: a slower poll for its longer runs.
    run_all(args, work, path, args.llama_parallel, 0.5, lambda replicas: LlamaEngines(replicas, work, start))


def run_all(args: argparse.Namespace, work: Path, path: Path, concurrency: int, poll_seconds: float,
            make_engines: Callable[[int], Engines]) -> None:
    engines: dict[int, Engines] = {}
    results: dict[Workload, list[Run]] = {}
    try:
        for workload in workloads(args, concurrency):
            if workload.replicas not in engines:
                engines[workload.replicas] = make_engines(workload.replicas)
            results[workload] = run_workload(workload, engines[workload.replicas], work, path, args.rounds,
                                             poll_seconds, args.restart, not args.batches_only)
        compare_auto(results)
    finally:
        for started in engines.values():
            started.close()


if __name__ == "__main__":
    main()
