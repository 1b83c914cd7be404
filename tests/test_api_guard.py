"""The API's last line of defence (openrelay/api/guard.py), under a real uvicorn over real sockets.

No input we know of reaches it any more (tests/test_fuzz.py, tests/test_input_edges.py), so it is shown on a
route that fails on purpose: the answer is the OpenAI envelope (500 ``server_error``, JSON, never
``text/plain``), and the same keep-alive connection serves the next request.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from openrelay.api.guard import UNEXPECTED_MESSAGE, RenderUnexpectedErrors
from openrelay.http.request_ids import RequestIds
from tests.support.server import free_port


async def _fails(_request):  # type: ignore[no-untyped-def]
    raise TypeError("unhashable type: 'list'")


async def _fine(_request):  # type: ignore[no-untyped-def]
    return JSONResponse({"ok": True})


async def _breaks_midway(_request):  # type: ignore[no-untyped-def]
    async def chunks():  # type: ignore[no-untyped-def]
        yield b"first"
        raise RuntimeError("the blob went away")

    return StreamingResponse(chunks(), media_type="application/octet-stream")


@pytest.fixture
def base_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/fails", _fails), Route("/fine", _fine), Route("/midway", _breaks_midway)])
    app.add_middleware(RenderUnexpectedErrors)
    app.add_middleware(RequestIds, access_log=False)  # outside it, as api/app.py assembles them
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _port(resp: httpx.Response) -> int:
    sock: socket.socket = resp.extensions["network_stream"].get_extra_info("socket")
    return sock.getsockname()[1]


def test_an_unexpected_error_is_the_envelope_and_the_connection_stays(base_url: str) -> None:
    with httpx.Client(base_url=base_url, limits=httpx.Limits(max_connections=1)) as client:
        before = client.get("/fine")
        failed = client.get("/fails")
        assert failed.status_code == 500
        assert failed.headers["content-type"] == "application/json"
        request_id = failed.headers["x-request-id"]  # the id the log's traceback is under (api/guard.py)
        assert request_id.startswith("req_") and request_id != before.headers["x-request-id"]
        message = f"{UNEXPECTED_MESSAGE} (request ID {request_id}: please include it when you report this)"
        assert failed.json() == {"error": {"message": message, "type": "server_error", "code": "server_error",
                                           "param": None}}
        assert failed.headers.get("connection", "").lower() != "close"
        after = client.get("/fine")
        assert after.json() == {"ok": True}
        assert _port(before) == _port(failed) == _port(after)  # one connection carried all three


def test_a_stream_that_breaks_midway_is_cut_off_not_disguised(base_url: str) -> None:
    # Once the 200 and some bytes are out, only closing the connection tells the client the body is incomplete.
    with httpx.Client(base_url=base_url) as client, pytest.raises(httpx.HTTPError):
        client.get("/midway").read()
