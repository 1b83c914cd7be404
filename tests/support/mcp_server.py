"""A real MCP tool server for the tool-calling tests, built with the official ``mcp`` SDK (streamable HTTP).

Run: ``python tests/support/mcp_server.py [--host 127.0.0.1] [--port 0]``; once listening it prints
``READY port=<N>``; its endpoint is ``http://host:port/mcp``. Every tool call is counted, by tool name, at
``GET /calls`` (reset with ``POST /calls/reset``), with the ``x-tool-token`` header each call carried, so tests
can see what reached the server and what did not.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

CALLS: list[dict[str, Any]] = []
tools = MCPServer("openrelay-test-tools")


def _count(name: str, ctx: Context) -> None:
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    CALLS.append({"tool": name, "token": headers.get("x-tool-token") if headers is not None else None})


@tools.tool()
def add(a: int, b: int, ctx: Context) -> str:
    """Add two integers."""
    _count("add", ctx)
    return f"sum={a + b}"


@tools.tool()
def echo(text: str, ctx: Context) -> str:
    """Return the text unchanged."""
    _count("echo", ctx)
    return text


@tools.tool()
def explode(reason: str, ctx: Context) -> str:
    """Always fails."""
    _count("explode", ctx)
    raise ToolError(f"exploded: {reason}")


@tools.tool()
def huge(size: int, ctx: Context) -> str:
    """``size`` characters of output."""
    _count("huge", ctx)
    return "x" * size


@tools.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Answers after ``seconds``."""
    _count("slow", ctx)
    await asyncio.sleep(seconds)
    return "slept"


@tools.custom_route("/calls", methods=["GET"])
async def calls(request: Request) -> Response:
    return JSONResponse(CALLS)


@tools.custom_route("/calls/reset", methods=["POST"])
async def reset_calls(request: Request) -> Response:
    CALLS.clear()
    return JSONResponse({"ok": True})


async def _serve(server: Any, sock: socket.socket) -> None:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.005)
    if server.started:
        print(f"READY port={sock.getsockname()[1]}", flush=True)
    await task


def main(argv: list[str] | None = None) -> None:
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(256)
    app = tools.streamable_http_app(host=args.host)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1))
    asyncio.run(_serve(server, sock))


@contextlib.contextmanager
def running_mcp_server(host: str = "127.0.0.1", timeout: float = 30.0) -> Iterator[str]:
    """Yields the server's root URL (``http://host:port``); the MCP endpoint is that plus ``/mcp``."""
    proc = subprocess.Popen([sys.executable, __file__, "--host", host, "--port", "0"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith("READY port="):
            raise RuntimeError(f"MCP test server did not start (exit={proc.poll()}, line={line!r})")
        yield f"http://{host}:{int(line.split('=', 1)[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


if __name__ == "__main__":
    main()
