"""An upload is stored only whole (issue 11, part 3): its multipart body complete, with its closing boundary,
exactly one ``file`` part and each field once. Anything else is a 400 that leaves no file, no blob and no
temporary file behind. The bodies are sent over a raw socket, byte for byte as written here: a client library
would frame a form itself and never send these shapes."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import orjson

from tests.support.batches import wait_for

BOUNDARY = "b0undary-7f3a"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
LINES = b"".join(orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "test/echo", "messages": [{"role": "user", "content": "hi"}]}})
                 + b"\n" for i in range(3))


def file_part(content: bytes, name: str = "input.jsonl") -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + content + b"\r\n"


def field_part(name: str, value: str) -> bytes:
    return f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n".encode()


CLOSING = f"--{BOUNDARY}--\r\n".encode()
WHOLE = field_part("purpose", "batch") + file_part(LINES) + CLOSING


def post_raw(server, body: bytes, content_type: str = CONTENT_TYPE) -> tuple[int, dict[str, Any]]:
    """POST /v1/files with exactly these bytes (Content-Length: their length) over a plain socket."""
    head = (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {server.api_key}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, orjson.loads(response.read())


def blob_files(server) -> list[str]:
    """Every file under the blob store, temporary ones included."""
    root = server.data_dir / "blobs"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def stored_files(server) -> list[dict[str, Any]]:
    answer = server.http("GET", "/files")
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def test_a_multipart_body_that_is_cut_short_or_doubled_is_a_400_and_leaves_nothing(server):
    without_closing = field_part("purpose", "batch") + file_part(LINES)
    assert len(WHOLE) > 460 > 300
    refused = {
        # The probe: the first 300 bytes of the form, Content-Length honest about it; it was stored as a file.
        "cut in the file's bytes": (WHOLE[:300], "closing boundary"),
        "no closing boundary": (without_closing, "closing boundary"),
        "the closing boundary without its --": (without_closing + f"--{BOUNDARY}\r\n".encode(), "closing boundary"),
        "cut inside the closing boundary": (without_closing + f"--{BOUNDARY}-".encode(), "closing boundary"),
        "cut in a part's headers": (field_part("purpose", "batch") + file_part(LINES)[:40], "closing boundary"),
        # The probe: two file parts were joined into one file.
        "two file parts": (field_part("purpose", "batch") + file_part(LINES) + file_part(b'{"more": 1}\n', "b.jsonl")
                           + CLOSING, "more than one 'file' part"),
        "two purpose fields": (field_part("purpose", "batch") + field_part("purpose", "batch") + file_part(LINES)
                               + CLOSING, "more than one 'purpose' field"),
        "no opening boundary": (b"garbage\r\n" + WHOLE, "malformed multipart body"),
    }
    for what, (body, message) in refused.items():
        status, answer = post_raw(server, body)
        assert status == 400, (what, answer)
        assert answer["error"]["type"] == answer["error"]["code"] == "invalid_request_error", (what, answer)
        assert message in answer["error"]["message"], (what, answer)
        assert stored_files(server) == [] and blob_files(server) == [], what

    # The same bytes, whole, are stored byte for byte: the refusals are about the shape, not the content.
    status, answer = post_raw(server, WHOLE)
    assert status == 200, answer
    assert answer["bytes"] == len(LINES) and answer["filename"] == "input.jsonl"
    assert server.http("GET", f"/files/{answer['id']}/content").content == LINES
    assert [f["id"] for f in stored_files(server)] == [answer["id"]]
    assert blob_files(server) == [f"files/{answer['id']}"]


def test_a_client_that_goes_away_mid_upload_leaves_nothing(server):
    head = (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {server.api_key}\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(WHOLE)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + WHOLE[:300])
        # The upload's temporary blob exists while the server waits for the rest of the body ...
        wait_for(lambda: blob_files(server), "the upload's temporary blob")
    # ... and goes once the client has gone.
    wait_for(lambda: blob_files(server) == [], "the temporary blob to be removed")
    assert stored_files(server) == []
