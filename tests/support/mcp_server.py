"""A real MCP tool server for the tool-calling tests, built with the official ``mcp`` SDK (streamable HTTP).

Run: ``python -m tests.support.mcp_server [--host 127.0.0.1] [--port 0]``; once listening it prints
``READY port=<N>``; its endpoint is ``http://host:port/mcp``. Every tool call is counted, by tool name, at
``GET /calls`` (reset with ``POST /calls/reset``), with the ``x-tool-token`` header each call carried, so tests
can see what reached the server and what did not.

Requests carrying an ``x-legacy-mcp`` header meet a server of the protocol's handshake era: ``server/discover``
is an unknown method, so the client falls back to ``initialize`` and gets a session, which it closes with a
DELETE. Every DELETE is listed at ``GET /deletes`` with its ``x-tool-token``; one carrying ``x-stall-delete`` is
never answered, as by a server that hangs while a client closes its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.support.announce import listen, serve_announced, start_announced, stop

CALLS: list[dict[str, Any]] = []
DELETES: list[dict[str, Any]] = []
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
    DELETES.clear()
    return JSONResponse({"ok": True})


@tools.custom_route("/deletes", methods=["GET"])
async def deletes(request: Request) -> Response:
    return JSONResponse(DELETES)


def _legacy_mode(app: Any) -> Any:
    """The MCP app, as a handshake-era server to requests carrying ``x-legacy-mcp``; DELETEs noted, and never
    answered when they carry ``x-stall-delete``."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        if scope["method"] == "DELETE":
            DELETES.append({"token": headers.get("x-tool-token"), "stalled": "x-stall-delete" in headers})
            if "x-stall-delete" in headers:
                await asyncio.Event().wait()
        if scope["method"] == "POST" and "x-legacy-mcp" in headers:
            body, more = b"", True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            request = json.loads(body or b"null")
            if isinstance(request, dict) and request.get("method") == "server/discover":
                answer = {"jsonrpc": "2.0", "id": request.get("id"),
                          "error": {"code": -32601, "message": "Method not found"}}
                return await JSONResponse(answer)(scope, receive, send)
            replayed = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive_again() -> dict[str, Any]:
                return replayed.pop() if replayed else await receive()

            return await app(scope, receive_again, send)
        return await app(scope, receive, send)

    return wrapped


def main(argv: list[str] | None = None) -> None:
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    sock = listen(args.host, args.port, 256)
    app = _legacy_mode(tools.streamable_http_app(host=args.host))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1))
    asyncio.run(serve_announced(server, sock))


@contextlib.contextmanager
def running_mcp_server(host: str = "127.0.0.1", timeout: float = 30.0) -> Iterator[str]:
    """Yields the server's root URL (``http://host:port``); the MCP endpoint is that plus ``/mcp``."""
    proc, port = start_announced("tests.support.mcp_server", ["--host", host, "--port", "0"], "MCP test server",
                                 timeout)
    try:
        yield f"http://{host}:{port}"
    finally:
        stop(proc)

if __name__ == "__main__":
    main()
