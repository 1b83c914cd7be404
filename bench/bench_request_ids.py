"""What request ids and traces cost with tracing off, in process (no socket, so the machine's load blurs it less).

    git archive dad9557 openrelay | tar -x -C /tmp/before     # before request ids: its AccessLog layer
    .venv/bin/python bench/bench_request_ids.py [--before /tmp/before] [--rounds 9]

Per request: the CPU of the outermost ASGI layer around a bare app answering 200, as `orl serve` runs it by default
(access log on, its INFO lines formatted and written to /dev/null): ``RequestIds`` (http/request_ids.py), and with
``--before`` the ``AccessLog`` of that code in its place. Per record: a worker's ``tracing.engine_calls`` and
``tracing.call_headers`` with tracing off (the request id set, the header dict made). Minimum and median of the
rounds, in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


async def bare(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b""}


async def discard(message: Any) -> None:
    pass


async def per_request(app: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        scope = {"type": "http", "method": "GET", "path": "/v1/batches/batch_0123456789ab", "headers": [], "state": {}}
        await app(scope, receive, discard)
    return (time.perf_counter() - started) / n * 1e6


def load_before(folder: str) -> Any:
    """The AccessLog class of the code in ``folder``; its modules are forgotten after, so this tree's load next."""
    sys.path.insert(0, folder)
    from openrelay.http.access_log import AccessLog

    for name in [m for m in sys.modules if m == "openrelay" or m.startswith("openrelay.")]:
        del sys.modules[name]
    sys.path.remove(folder)
    return AccessLog


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=open("/dev/null", "w"))  # noqa: SIM115 - for the whole run
    layers: dict[str, Any] = {"bare app": bare}
    if args.before:
        layers["before: AccessLog"] = load_before(args.before)(bare)
    sys.path.insert(0, str(REPO))
    from openrelay import tracing
    from openrelay.http.request_ids import RequestIds

    layers["RequestIds, access log on"] = RequestIds(bare, access_log=True)
    layers["RequestIds, access log off"] = RequestIds(bare, access_log=False)
    rows: dict[str, list[float]] = {name: [] for name in layers}
    for _ in range(args.rounds):
        for name, app in layers.items():
            rows[name].append(await per_request(app, 20_000))
    for name, times in rows.items():
        print(f"{name}: min {min(times):.2f} us, median {statistics.median(times):.2f} us per request")
    records = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        for line in range(100_000):
            with tracing.engine_calls("req_0123456789abcdef0123456789abcdef", "batch_0123456789ab", line):
                tracing.call_headers()
        records.append((time.perf_counter() - started) / 100_000 * 1e6)
    print(f"a record's engine_calls + call_headers, tracing off: min {min(records):.2f} us, "
          f"median {statistics.median(records):.2f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a folder holding another code's openrelay package")
    parser.add_argument("--rounds", type=int, default=9)
    asyncio.run(main(parser.parse_args()))
