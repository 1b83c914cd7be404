"""Benchmark for issue 5: completion tokens/s of a batch through `orl serve` against a real llama.cpp server vs. a
direct asyncio client at the same concurrency, both timed by the engine.

    .venv/bin/python bench/bench_llama_server.py [--requests 12] [--concurrency 4] [--max-tokens 32] [--repeat 8]

The engine is llama-cpp-python's OpenAI server on SmolLM2-135M (one thread), run through a thin wrapper that
serves the very app `python -m llama_cpp.server` builds, plus a pure-ASGI timer: it notes when the first
completion request arrives and when the last answer's final byte leaves, and serves those at /bench/stats.
That server runs one request at a time (one llama.cpp context behind a lock); concurrency keeps its queue full.
Tokens/s = completion tokens (summed from the answers' usage; the batch's usage for the batch) / engine time.
Runs come in pairs, back to back in alternating order; printed are the ratio of the best runs and the median of
the paired ratios (which a busy shared machine distorts less), the engine's idle time between first request and
last answer (time with no request in it: the client not keeping it busy), and the CPU `orl serve` spent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.llama_server import start_llama_server, stop_llama_server  # noqa: E402
from tests.support.server import Server, free_port  # noqa: E402

CATALOG = """
[[models]]
name = "bench/smollm2"
endpoints = ["/v1/chat/completions"]
slots = 1
concurrency = {concurrency}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "smollm2" }}
"""
TOPICS = ["rivers", "bread", "clocks", "owls", "glass", "maps", "tides", "bees", "salt", "kites", "moss", "ice"]


def write_records(path: Path, count: int, max_tokens: int) -> None:
    with open(path, "wb") as out:
        for i in range(count):
            question = f"Write two sentences about {TOPICS[i % len(TOPICS)]}, item {i}."
            out.write(orjson.dumps({
                "custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "bench/smollm2", "max_tokens": max_tokens, "temperature": 0,
                         "messages": [{"role": "user", "content": question}]},
            }) + b"\n")


# -- the engine: llama_cpp.server's app with a timer in front -------------------------------------------------


def serve_timed_engine(argv: list[str]) -> None:
    """Runs in the engine subprocess (``bench_llama_server.py --serve-engine <llama_cpp.server flags>``): what
    ``llama_cpp.server.__main__`` does with command-line flags, with the app wrapped in the timer."""
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

    parser = argparse.ArgumentParser()
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    server_settings = parse_model_from_args(ServerSettings, args)
    app = create_app(server_settings=server_settings, model_settings=[parse_model_from_args(ModelSettings, args)])
    uvicorn.run(timed(app), host=server_settings.host, port=server_settings.port)


def timed(app: Any) -> Any:
    """``app`` behind a timer of its completion requests: the first arrival, the last answer's final byte, and
    the time with none in flight in between (the engine idle, waiting for its client)."""
    stats: dict[str, Any] = {}
    in_flight = 0
    idle_since = 0.0

    def reset() -> None:
        stats.update(requests=0, first_at=None, last_at=None, idle_seconds=0.0)

    async def wrapper(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal in_flight, idle_since
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path in ("/bench/stats", "/bench/reset"):
            if path == "/bench/reset":
                reset()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": orjson.dumps(stats)})
            return
        if not path.endswith("/completions"):
            await app(scope, receive, send)
            return
        now = time.time()
        if stats["first_at"] is None:
            stats["first_at"] = now
        elif in_flight == 0:
            stats["idle_seconds"] += now - idle_since
        in_flight += 1

        async def send_and_time(message: dict[str, Any]) -> None:
            nonlocal in_flight, idle_since
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                in_flight -= 1
                stats["last_at"] = idle_since = time.time()
                stats["requests"] += 1

        await app(scope, receive, send_and_time)

    reset()
    return wrapper


def engine_times(root: str, expected: int) -> tuple[float, float]:
    """(seconds from the first arrival to the last answer, seconds of them with no request in the engine)."""
    stats = httpx.get(f"{root}/bench/stats", timeout=10).json()
    assert stats["requests"] == expected, stats
    return stats["last_at"] - stats["first_at"], stats["idle_seconds"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the two clients -------------------------------------------------------------------------------------------


async def direct_client_tokens(engine_url: str, path: Path, concurrency: int) -> int:
    """The baseline: read each record, send its body (model renamed) with aiohttp at the same concurrency, parse
    each answer; returns the completion tokens the answers report."""
    tokens = 0
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers={"content-type": "application/json"}) as client:
        with open(path, "rb") as handle:
            lines = iter(handle)

            async def lane() -> None:
                nonlocal tokens
                for raw in lines:
                    body = orjson.loads(raw)["body"]
                    async with client.post(f"{engine_url}/chat/completions",
                                           data=orjson.dumps({**body, "model": "smollm2"})) as response:
                        answer = orjson.loads(await response.read())
                    assert response.status == 200, answer
                    tokens += answer["usage"]["completion_tokens"]

            await asyncio.gather(*(lane() for _ in range(concurrency)))
    return tokens


def batch_tokens(server: Server, file_id: str, count: int) -> int:
    answer = server.http("POST", "/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                   "completion_window": "24h"})
    answer.raise_for_status()
    batch_id = answer.json()["id"]
    while True:
        batch = server.http("GET", f"/batches/{batch_id}").json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            break
        time.sleep(2)  # slow polls: the engine's own clock times the run, and polls cost orl serve CPU
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == count, batch
    return batch["usage"]["output_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=12, help="chat requests per run")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads of the engine")
    parser.add_argument("--repeat", type=int, default=8, help="pairs of runs (batch, direct)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orl-bench-llama-"))
    engine_proc, engine_url = start_llama_server(
        free_port(), work / "engine.log", n_ctx=512, n_threads=args.threads,
        module=(str(Path(__file__).resolve()), "--serve-engine"))
    root = engine_url.removesuffix("/v1")
    (work / "data").mkdir()
    (work / "catalog.toml").write_text(CATALOG.format(engine=engine_url, concurrency=args.concurrency))
    server = Server(data_dir=work / "data", database_url=f"sqlite:///{work / 'data' / 'openrelay.db'}",
                    port=free_port(), env={}, args=["--catalog", str(work / "catalog.toml")])
    try:
        server.start()
        records = work / "run.jsonl"
        write_records(records, args.requests, args.max_tokens)
        with open(records, "rb") as handle:
            uploaded = server.http("POST", "/files", files={"file": ("run.jsonl", handle)}, data={"purpose": "batch"})
        uploaded.raise_for_status()
        # Warm up: the first answers after a load page in the weights; neither side should pay for that.
        asyncio.run(direct_client_tokens(engine_url, records, args.concurrency))
        runs: dict[str, list[float]] = {"batch": [], "direct": []}
        idle = {"batch": 0.0, "direct": 0.0}
        counted = {"batch": 0, "direct": 0}
        serve_cpu: dict[str, list[float]] = {"batch": [], "direct": []}
        for i in range(args.repeat):
            # Pairs back to back, in alternating order: the machine's drift hits both sides of a pair alike.
            for side in ("batch", "direct") if i % 2 == 0 else ("direct", "batch"):
                httpx.post(f"{root}/bench/reset", timeout=10)
                cpu_before = cpu_seconds(server.proc.pid)
                if side == "batch":
                    tokens = batch_tokens(server, uploaded.json()["id"], args.requests)
                else:
                    tokens = asyncio.run(direct_client_tokens(engine_url, records, args.concurrency))
                serve_cpu[side].append(cpu_seconds(server.proc.pid) - cpu_before)
                seconds, idle_seconds = engine_times(root, args.requests)
                runs[side].append(tokens / seconds)
                counted[side] = tokens
                idle[side] = max(idle[side], idle_seconds)
        ours, theirs = runs["batch"], runs["direct"]
        paired = statistics.median(b / d for b, d in zip(ours, theirs, strict=True))
        print(f"llama_cpp.server (SmolLM2-135M Q4_1, {args.threads} thread), {args.requests} chat requests of "
              f"max_tokens {args.max_tokens} at concurrency {args.concurrency}, {args.repeat} pairs of runs: "
              f"best batch {max(ours):.1f} completion tokens/s; best direct asyncio client {max(theirs):.1f} "
              f"tokens/s; ratio of the bests {max(ours) / max(theirs):.3f}, median of the paired ratios "
              f"{paired:.3f} (goal >= 0.97)")
        print(f"all runs, tokens/s: batch {', '.join(f'{x:.1f}' for x in ours)}; "
              f"direct {', '.join(f'{x:.1f}' for x in theirs)}")
        print(f"completion tokens per run: batch {counted['batch']}, direct {counted['direct']}; engine idle between "
              f"first request and last answer, worst run: batch {idle['batch'] * 1000:.0f} ms, "
              f"direct {idle['direct'] * 1000:.0f} ms; orl serve CPU per run (idle during direct runs): batch "
              f"{', '.join(f'{x:.2f}' for x in serve_cpu['batch'])} s; direct "
              f"{', '.join(f'{x:.2f}' for x in serve_cpu['direct'])} s")
    finally:
        server.stop()
        stop_llama_server(engine_proc)
        if os.environ.get("KEEP_BENCH_DIR") is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-engine"]:
        serve_timed_engine(sys.argv[2:])
    else:
        main()
