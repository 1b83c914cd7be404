"""Helper servers started as processes (the test engine, the MCP test server) and how they say they are ready.

Each binds its own socket, so ``--port 0`` works, and prints ``READY port=<N>`` once uvicorn serves it; callers
block on that line instead of polling.
"""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def listen(host: str, port: int, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


async def serve_announced(server: Any, sock: socket.socket) -> None:
    """Runs a ``uvicorn.Server`` on ``sock``; prints READY only once it has started, so callers never race it."""
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.005)
    if server.started:
        print(f"READY port={sock.getsockname()[1]}", flush=True)
    await task


def start_announced(module: str, args: list[str], what: str, timeout: float) -> tuple[subprocess.Popen[bytes], int]:
    """Starts ``python -m module args`` from the repo root; returns the process and the port it announced."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith("READY port="):
            raise RuntimeError(f"{what} did not start (exit={proc.poll()}, line={line!r})")
    except BaseException:
        stop(proc)
        raise
    return proc, int(line.split("=", 1)[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
