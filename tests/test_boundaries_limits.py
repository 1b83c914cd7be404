"""Limits on reading a request (issue 11, part 1), against a real `orl serve` over real sockets, on either store.

Request line and headers over 64 KB are 431; a create's body over 100 MB and any other JSON body over 1 MB are
413 (from the declared length before reading, or as soon as a chunked body passes); a request whose headers or
body do not arrive in time is 408. Each is the OpenAI envelope with the connection closed, the server's memory
does not grow beyond the limit, and other clients are answered meanwhile. Raw sockets send what a client library
would not (a 64 MB header, a body shorter than its Content-Length, a chunked body past the limit).
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import openai
import psutil
import pytest

from tests.support import http_client
from tests.support.batches import CHAT, chat, error_of
from tests.support.server import Server

MB = 1_000_000
MEMORY_SLACK = 10 * 1024 * 1024  # what the server may grow by beyond a limit while it refuses (RSS, bytes)


# -- raw HTTP -------------------------------------------------------------------------------------------------------

def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _head(method: str, path: str, server: Server | None = None, *lines: str) -> bytes:
    auth = [f"Authorization: Bearer {server.api_key}"] if server else []
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *auth, *lines, "", ""]).encode()


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The one answer on ``sock``, read to its end (a reset after it is the server closing with bytes unread)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    while len(body) < int(headers["content-length"]):
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def _refusal(answer: tuple[int, dict[str, str], bytes], status: int, code: str) -> dict[str, Any]:
    """The error of a raw answer, after checking it is ``status``/``code`` in the envelope with the connection
    closed."""
    got, headers, body = answer
    assert got == status, (got, body[:500])
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert (error["code"], error["type"], error["param"]) == (code, "invalid_request_error", None), error
    assert error["message"]
    return error


def _closed(sock: socket.socket, deadline: float = 30.0) -> bool:
    """Whether the server has closed ``sock`` (after its answer, if any): reading on gives end of file or a reset.
    False when the connection is still open at ``deadline`` (a guard against a hang: a server that closes does so
    as it answers)."""
    sock.settimeout(deadline)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return False
    return True


def _send_quietly(sock: socket.socket, chunks: Iterator[bytes]) -> None:
    """Send until the server stops reading (it answers and closes when it refuses)."""
    try:
        for chunk in chunks:
            sock.sendall(chunk)
    except OSError:
        pass


def _create_body(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"endpoint": CHAT, "completion_window": "24h", "requests": records}


def _create_inline(server: Server, records: list[dict[str, Any]]) -> openai.types.Batch:
    """An inline create through the SDK (which has no ``requests`` parameter: its raw ``post``)."""
    return server.client().post("/batches", body=_create_body(records), cast_to=openai.types.Batch)


def _healthy(server: Server) -> None:
    assert http_client.get(f"http://127.0.0.1:{server.port}/healthz", timeout=30).json() == {"status": "ok"}


# -- memory -------------------------------------------------------------------------------------------------------

@contextmanager
def _peak_growth(server: Server) -> Iterator[Callable[[], int]]:
    """Samples the server process's RSS while the block runs; yields a function giving the peak growth."""
    assert server.proc is not None
    process = psutil.Process(server.proc.pid)
    baseline = process.memory_info().rss
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak - baseline
    finally:
        done.set()
        sampler.join()
        peak = max(peak, process.memory_info().rss)


def _body_of(size: int, piece: bytes = b"x" * 1_000_000) -> Iterator[bytes]:
    while size > 0:
        yield piece[:size]
        size -= len(piece)


def _chunked(size: int) -> Iterator[bytes]:
    for piece in _body_of(size):
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


# -- headers --------------------------------------------------------------------------------------------------------

def test_headers_over_64_kb_are_431_without_memory_and_others_are_answered(make_server):
    server = make_server()
    near = "x" * 60_000  # request line and headers under 64 KB in all: read, and judged as a key
    error_of(server.http("GET", "/models", headers={"authorization": f"Bearer {near}"}), 401, "invalid_api_key")

    big = b"Bearer " + b"k" * 64 * 1024 * 1024  # the probe: 64 MB of Authorization, no valid key
    with _peak_growth(server) as growth:
        sock = _connect(server)
        sender = threading.Thread(target=_send_quietly, args=(sock, iter([
            _head("GET", "/v1/models").removesuffix(b"\r\n"), b"Authorization: ", big, b"\r\n\r\n"])))
        sender.start()
        _healthy(server)  # another client meanwhile
        error = _refusal(_read_answer(sock), 431, "headers_too_large")
        sender.join()
        sock.close()
    assert "65536" in error["message"]
    assert growth() < MEMORY_SLACK, f"RSS grew {growth() / 2**20:.1f} MiB refusing a 64 MB header"

    # Many small headers count together.
    with _connect(server) as sock:
        sock.sendall(_head("GET", "/healthz", None, *(f"x-h{i}: {'v' * 60}" for i in range(2000))))
        _refusal(_read_answer(sock), 431, "headers_too_large")
        assert _closed(sock)
    # So does the request line.
    with _connect(server) as sock:
        sock.sendall(_head("GET", "/healthz?q=" + "a" * 70_000))
        _refusal(_read_answer(sock), 431, "headers_too_large")
    _healthy(server)


def test_max_header_bytes_flag_and_malformed_http_is_400_in_the_envelope(make_server):
    server = make_server(args=("--max-header-bytes", "2048"))
    with _connect(server) as sock:
        sock.sendall(_head("GET", "/healthz", None, "x-pad: " + "p" * 3000))
        _refusal(_read_answer(sock), 431, "headers_too_large")
    with _connect(server) as sock:
        sock.sendall(_head("GET", "/healthz", None, "x-pad: " + "p" * 1500))
        assert _read_answer(sock)[0] == 200
    with _connect(server) as sock:  # a pipelined request read together with the end of a big body is not 431
        sock.sendall(_head("POST", "/healthz", None, "Content-Length: 200000") + b"b" * 200_000
                     + _head("GET", "/healthz"))
        data = b""
        while b'{"status":"ok"}' not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", data) == [b"405", b"200"]
    for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                    b"Content-Length: 3\r\n\r\nabc"):
        with _connect(server) as sock:
            sock.sendall(garbage)
            _refusal(_read_answer(sock), 400, "invalid_http_request")
            assert _closed(sock)
    _healthy(server)


# -- bodies -------------------------------------------------------------------------------------------------------

def test_a_300_mb_inline_create_is_413_from_its_length_before_reading(make_server):
    server = make_server()
    size = 300 * MB
    with _peak_growth(server) as growth:
        sock = _connect(server)
        sock.sendall(_head("POST", "/v1/batches", server, "Content-Type: application/json",
                           f"Content-Length: {size}"))
        sender = threading.Thread(target=_send_quietly, args=(sock, _body_of(size)))
        sender.start()
        error = _refusal(_read_answer(sock), 413, "request_too_large")
        sender.join()
        sock.close()
    assert "100000000" in error["message"] and "input_file_id" in error["message"]
    assert growth() < MEMORY_SLACK, f"RSS grew {growth() / 2**20:.1f} MiB refusing a 300 MB create"
    assert server.client().batches.list().data == []
    _healthy(server)


def test_a_chunked_create_is_413_as_soon_as_it_passes_the_limit(make_server):
    limit = 5 * MB
    server = make_server(args=("--max-create-bytes", str(limit)))
    with _peak_growth(server) as growth:
        sock = _connect(server)
        sock.sendall(_head("POST", "/v1/batches", server, "Content-Type: application/json",
                           "Transfer-Encoding: chunked"))
        sender = threading.Thread(target=_send_quietly, args=(sock, _chunked(300 * MB)))
        sender.start()
        _healthy(server)
        _refusal(_read_answer(sock), 413, "request_too_large")
        sender.join()
        sock.close()
    assert growth() < limit + MEMORY_SLACK, f"RSS grew {growth() / 2**20:.1f} MiB over a {limit} B limit"
    assert server.client().batches.list().data == []


def test_create_limit_through_the_sdk_and_at_the_limit(make_server):
    records = [chat(f"r{i}", text="x" * 1000) for i in range(40)]  # some 47 KB inline
    body = json.dumps(_create_body(records)).encode()
    server = make_server(args=("--max-create-bytes", str(len(body))))
    at_limit = server.http("POST", "/batches", content=body, headers={"content-type": "application/json"})
    assert at_limit.status_code == 200, at_limit.text  # exactly the limit is allowed
    with pytest.raises(openai.APIStatusError) as caught:
        _create_inline(server, records * 2)
    assert caught.value.status_code == 413
    assert caught.value.body["code"] == "request_too_large"
    assert [b.id for b in server.client().batches.list().data] == [at_limit.json()["id"]]


def test_other_json_bodies_are_held_to_1_mb(make_server):
    server = make_server(args=("--no-worker",))  # the batch stays live, so the cancel below is accepted
    batch = _create_inline(server, [chat("a")])
    metadata = f"/v1/batches/{batch.id}/metadata"

    with _peak_growth(server) as growth:  # the probe: 60 MB of metadata
        sock = _connect(server)
        sock.sendall(_head("POST", metadata, server, "Content-Type: application/json",
                           f"Content-Length: {60 * MB}"))
        sender = threading.Thread(target=_send_quietly, args=(sock, _body_of(60 * MB)))
        sender.start()
        error = _refusal(_read_answer(sock), 413, "request_too_large")
        sender.join()
        sock.close()
    assert "1000000" in error["message"]
    assert growth() < MEMORY_SLACK

    with _connect(server) as sock:  # chunked, and on a route that reads no body
        sock.sendall(_head("POST", f"/v1/batches/{batch.id}/cancel", server, "Transfer-Encoding: chunked"))
        _send_quietly(sock, _chunked(3 * MB))
        status, _headers, answer = _read_answer(sock)  # cancel answers without reading its body: nothing is held
        assert (status, json.loads(answer)["status"]) == (200, "cancelling"), answer
    with _connect(server) as sock:
        sock.sendall(_head("POST", metadata, server, "Content-Type: application/json",
                           "Transfer-Encoding: chunked"))
        _send_quietly(sock, _chunked(3 * MB))
        _refusal(_read_answer(sock), 413, "request_too_large")

    small = server.http("POST", f"/batches/{batch.id}/metadata", json={"metadata": {"k": "v" * 400}})
    assert small.status_code == 200, small.text
    _healthy(server)


def test_json_limit_from_the_environment(make_server):
    server = make_server(env={"OPENRELAY_MAX_JSON_BYTES": "100"})
    batch = _create_inline(server, [chat("a")])
    path = f"/batches/{batch.id}/metadata"
    error_of(server.http("POST", path, json={"metadata": {"k": "v" * 200}}), 413, "request_too_large")
    assert server.http("POST", path, json={"metadata": {"k": "v"}}).status_code == 200


# -- time -------------------------------------------------------------------------------------------------------

def test_slow_headers_and_stalled_bodies_are_408_and_others_are_answered(make_server):
    server = make_server(args=("--header-timeout", "1", "--body-timeout", "1"))

    with _connect(server) as sock:  # the request line and half the headers, then nothing
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        _healthy(server)
        _refusal(_read_answer(sock), 408, "request_timeout")
        assert _closed(sock)

    with _connect(server) as sock:  # the probe: a Content-Length larger than the body sent
        sock.sendall(_head("POST", "/v1/batches", server, "Content-Type: application/json",
                           "Content-Length: 1000") + b'{"endpoint": ')
        _healthy(server)
        _refusal(_read_answer(sock), 408, "request_timeout")
        assert _closed(sock)

    with _connect(server) as sock:  # connected, not a byte sent: closed without an answer
        assert sock.recv(100) == b""
    assert server.client().batches.list().data == []
    _healthy(server)


def test_a_slow_steady_body_and_an_idle_keep_alive_are_not_timed_out(make_server):
    server = make_server(args=("--header-timeout", "1.5", "--body-timeout", "1.5"))
    body = json.dumps(_create_body([chat("slow")])).encode()
    with _connect(server) as sock:
        sock.sendall(_head("GET", "/healthz"))
        assert _read_answer(sock)[0] == 200
        # Idle between requests is keep-alive's (uvicorn's 5 s), not the header clock's: a connection whose headers
        # began after this idle did is refused once the header clock runs out, and this one is still served.
        with _connect(server) as stalled:
            stalled.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
            _refusal(_read_answer(stalled), 408, "request_timeout")
        sock.sendall(_head("POST", "/v1/batches", server, "Content-Type: application/json",
                           f"Content-Length: {len(body)}"))
        # A body sent a few bytes at a time, never idle as long as the body timeout, outlasts it: it goes on until
        # a body stalled after this one began is refused, then ends.
        pieces = [body[i:i + 2] for i in range(0, len(body), 2)]
        with _connect(server) as stalled:
            stalled.sendall(_head("POST", "/v1/batches", server, "Content-Type: application/json",
                                  "Content-Length: 1000") + b'{"endpoint": ')
            while not select.select([stalled], [], [], 0.25)[0]:
                assert len(pieces) > 1, "the stalled body was not refused while this one was sent"
                sock.sendall(pieces.pop(0))
            _refusal(_read_answer(stalled), 408, "request_timeout")
        sock.sendall(b"".join(pieces))
        status, _headers, answer = _read_answer(sock)
        assert status == 200, answer
        assert json.loads(answer)["status"] == "validating"
