"""Issue 25 part 1: what an early abort saves on a broken batch, end to end.

    .venv/bin/python bench/bench_early_abort.py [--records 5000] [--fail-share 0.9] [--concurrency 8]
                                                [--error-rate 0.2] [--min-records 50] [--sleep 0.01]

Starts the test engine (each call sleeping ``--sleep`` seconds, a stand-in for inference time) and an `orl serve`
on SQLite, then runs the same batch twice, ``--fail-share`` of its records failing at run time (``#status=400``,
spread evenly): once with no ``failure_threshold`` and once with ``{"error_rate", "min_records"}``. For each it
prints the status, the engine calls, the records billed, the cost and the wall time from create to the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.batches import chat, post_batch, prompt_text  # noqa: E402
from tests.support.server import Server, catalog_text, free_port  # noqa: E402
from tests.support.test_engine import EngineControl, start_test_engine, stop_test_engine  # noqa: E402


def records(n: int, fail_share: float, sleep: float, run: str) -> list[dict[str, Any]]:
    every = max(1, round(1 / (1 - fail_share))) if fail_share < 1 else 0  # one success per `every` records
    return [chat(f"r-{i}", f"{run} {i} #sleep={sleep}" + ("" if every and i % every == 0 else " #status=400"))
            for i in range(n)]


def run_once(server: Server, engine: EngineControl, args: argparse.Namespace, run: str,
             threshold: dict[str, Any] | None) -> None:
    fields = {} if threshold is None else {"failure_threshold": threshold}
    started = time.perf_counter()
    made = post_batch(server, requests=records(args.records, args.fail_share, args.sleep, run), **fields)
    assert made.status_code == 200, made.text
    done = server.wait(made.json()["id"], timeout=3600)
    seconds = time.perf_counter() - started
    calls = sum(1 for r in engine.requests() if prompt_text(r).startswith(f"{run} "))
    counts = done["request_counts"]
    print(f"{'threshold ' + str(threshold) if threshold else 'no threshold':<52} {done['status']:<9} "
          f"engine calls {calls:>6} of {args.records}  completed {counts['completed']:>5}  "
          f"cost {done['usage']['cost_nano_usd']:>9} nano-USD  {seconds:7.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--fail-share", type=float, default=0.9)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--error-rate", type=float, default=0.2)
    parser.add_argument("--min-records", type=int, default=50)
    parser.add_argument("--sleep", type=float, default=0.01)
    args = parser.parse_args()
    proc, url = start_test_engine()
    try:
        engine = EngineControl(url)
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp)
            (data / "catalog.toml").write_text(catalog_text(url, concurrency=args.concurrency))
            server = Server(data_dir=data, database_url=f"sqlite:///{data / 'openrelay.db'}", port=free_port(),
                            args=["--catalog", str(data / "catalog.toml")],
                            env={"OPENRELAY_TICK_SECONDS": "0.05"}).start()
            try:
                run_once(server, engine, args, "plain", None)
                run_once(server, engine, args, "abort",
                         {"error_rate": args.error_rate, "min_records": args.min_records})
            finally:
                server.stop()
    finally:
        stop_test_engine(proc)


if __name__ == "__main__":
    main()
