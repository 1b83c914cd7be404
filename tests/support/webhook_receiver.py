"""A webhook receiver for tests, run as its own process: it records every POST it gets and answers as told.

Each test posts to a path of its own (``/hooks/<name>``), and the rules are per path: fail the next N requests
with a status; hold requests unanswered until told to let them go (to kill a server mid-delivery, or to hang);
or trickle the answer's head one byte at a time, never ending it, until told to let them go. Each request is
recorded with what was still open on its path when it came (``open_beside``, and ``overlapped``: another attempt
of the same ``webhook-id``), judged by the connections themselves. Control endpoints under ``/_control``;
``Receiver`` drives them from a test.

    python -m tests.support.webhook_receiver --port 0     # prints READY port=<N>
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
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
        self.trickle: dict[str, float] = {}  # path -> seconds between bytes
        self.open: dict[int, socket.socket] = {}  # request's seq -> its connection, until it is answered


def _still_open(connection: socket.socket) -> bool:
    """Whether the sender still holds ``connection`` (it closes it when its attempt ends)."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


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
        headers = {k.lower(): v for k, v in self.headers.items()}
        with STATE.lock:
            beside = [r for r in STATE.requests if r["path"] == self.path and r["seq"] in STATE.open
                      and _still_open(STATE.open[r["seq"]])]
            record = {"path": self.path, "headers": headers, "body": base64.b64encode(body).decode(),
                      "received_at": time.time(), "answered": None, "seq": len(STATE.requests),
                      "open_beside": len(beside),
                      "overlapped": any(r["headers"].get("webhook-id") == headers.get("webhook-id") for r in beside)}
            STATE.requests.append(record)
            STATE.open[record["seq"]] = self.connection
            STATE.lock.notify_all()
            rule = STATE.fail.get(self.path)
            if rule and rule[0] > 0:
                rule[0] -= 1
                status = rule[1]
            else:
                while self.path in STATE.hold:
                    STATE.lock.wait()
                status = 200
        if status == 200 and self.path in STATE.trickle:
            answered = self._trickle()
        else:
            self._answer(status, {"ok": status < 300})
            answered = True
        with STATE.lock:
            record["answered"] = status if answered else None
            STATE.open.pop(record["seq"], None)

    def _trickle(self) -> bool:
        """The answer's head a byte at a time (an endless header once the status line is out) until the path is
        let go, then the rest of it; or nothing more once the sender hung up. Whether it was all sent."""
        head, sent = b"HTTP/1.1 200 OK\r\nx-trickle: ", 0
        while True:
            with STATE.lock:
                interval = STATE.trickle.get(self.path)
                if interval is not None:
                    STATE.lock.wait(interval)
                if self.path not in STATE.trickle:
                    break
            try:
                self.wfile.write(head[sent:sent + 1] or b"a")
            except OSError:
                self.close_connection = True
                return False
            sent += 1
        try:
            self.wfile.write(head[sent:] + b"\r\ncontent-length: 0\r\n\r\n")
        except OSError:
            self.close_connection = True
            return False
        return True

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
            elif what == "trickle":
                if args["every"]:
                    STATE.trickle[args["path"]] = float(args["every"])
                else:
                    STATE.trickle.pop(args["path"], None)
                    STATE.lock.notify_all()
            else:
                self._answer(404)
                return
        self._answer(200)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a delivery loop has up to 128 attempts in flight

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

    def trickle(self, name: str, every: float | None) -> None:
        """Answers to ``name`` come a byte every ``every`` seconds and never end, until ``trickle(name, None)``."""
        self._control("trickle", path=f"/hooks/{name}", every=every)

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
