"""A webhook receiver for tests, run as its own process: it records every POST it gets and answers as told.

Each test posts to a path of its own (``/hooks/<name>``), and the rules are per path: fail the next N requests
with a status, or hold requests unanswered until told to let them go (to kill a server mid-delivery). Control
endpoints under ``/_control``; ``Receiver`` drives them from a test.

    python -m tests.support.webhook_receiver --port 0     # prints READY port=<N>
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support import http_client
from tests.support.announce import start_announced, stop

__all__ = ["Receiver", "running_receiver"]


class _State:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.requests: list[dict[str, Any]] = []
        self.fail: dict[str, list[int]] = {}  # path -> [remaining, status]
        self.hold: set[str] = set()


STATE = _State()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any = None) -> None:
        data = json.dumps(body if body is not None else {}).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the sender is gone (killed mid-request): nothing to answer
            pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        if self.path.startswith("/_control/requests"):
            with STATE.lock:
                self._answer(200, STATE.requests)
        else:
            self._answer(404)

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if self.path.startswith("/_control/"):
            self._control(self.path.removeprefix("/_control/"), json.loads(body or b"{}"))
            return
        record = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                  "body": base64.b64encode(body).decode(), "received_at": time.time(), "answered": None}
        with STATE.lock:
            STATE.requests.append(record)
            STATE.lock.notify_all()
            rule = STATE.fail.get(self.path)
            if rule and rule[0] > 0:
                rule[0] -= 1
                status = rule[1]
            else:
                while self.path in STATE.hold:
                    STATE.lock.wait()
                status = 200
            record["answered"] = status
        self._answer(status, {"ok": status < 300})

    def _control(self, what: str, args: dict[str, Any]) -> None:
        with STATE.lock:
            if what == "fail":
                STATE.fail[args["path"]] = [int(args["count"]), int(args.get("status", 500))]
            elif what == "hold":
                if args["on"]:
                    STATE.hold.add(args["path"])
                else:
                    STATE.hold.discard(args["path"])
                    STATE.lock.notify_all()
            else:
                self._answer(404)
                return
        self._answer(200)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a delivery loop opens up to 32 connections at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A sender that hung up before reading the answer (OpenRelay does not read it) is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = _Server((args.host, args.port), _Handler)
    print(f"READY port={server.server_address[1]}", flush=True)
    server.serve_forever()


class Receiver:
    """A test's handle on the receiver process."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def url(self, name: str) -> str:
        return f"{self.base}/hooks/{name}"

    def _control(self, what: str, **args: Any) -> None:
        http_client.post(f"{self.base}/_control/{what}", json=args, timeout=10).raise_for_status()

    def fail(self, name: str, count: int, status: int = 500) -> None:
        """The next ``count`` requests to ``name`` are answered ``status``."""
        self._control("fail", path=f"/hooks/{name}", count=count, status=status)

    def hold(self, name: str, on: bool = True) -> None:
        """Requests to ``name`` get no answer until ``hold(name, False)``."""
        self._control("hold", path=f"/hooks/{name}", on=on)

    def requests(self, name: str) -> list[dict[str, Any]]:
        """What ``name`` received, oldest first, each with its ``body`` as bytes."""
        got = http_client.get(f"{self.base}/_control/requests", timeout=10).json()
        return [{**r, "body": base64.b64decode(r["body"])} for r in got if r["path"] == f"/hooks/{name}"]

    def wait_for(self, name: str, check: Callable[[list[dict[str, Any]]], bool], what: str,
                 timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            got = self.requests(name)
            if check(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"receiver: timed out after {timeout}s waiting for {what}; got {got}")
            time.sleep(0.05)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    proc, port = start_announced("tests.support.webhook_receiver", ["--port", "0"], "webhook receiver", 20)
    try:
        yield Receiver(port)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
