"""The dashboard's upload takes the API's path (http/uploads.py): streamed, held to the upload limit rather than the
1 MB of JSON routes, kept only when the form is whole and carries the session's CSRF token. Plain HTTP, no browser."""

from __future__ import annotations

import orjson

from tests.support.browser import signed_in_client


def _form(boundary: str, csrf: str, data: bytes, *, close: bool = True) -> bytes:
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode()
    return head + data + (f"\r\n--{boundary}--\r\n".encode() if close else b"")


def _file_ids(server) -> set[str]:
    return {f["id"] for f in server.http("GET", "/files").json()["data"]}


def test_a_dashboard_upload_over_a_megabyte_is_stored_whole_and_a_cut_one_not_at_all(server):
    with signed_in_client(server) as (client, csrf):
        line = orjson.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                             "body": {"model": "test/echo", "messages": [{"role": "user", "content": "y" * 900}]}})
        data = b"".join(line.replace(b'"x"', f'"r{i}"'.encode()) + b"\n" for i in range(3000))  # about 3 MB
        assert len(data) > 2_000_000
        headers = {"content-type": "multipart/form-data; boundary=b0undary"}
        before = _file_ids(server)

        cut = client.post("/new/upload", content=_form("b0undary", csrf, data[:1_500_000], close=False),
                          headers=headers)
        assert cut.status_code == 400
        forged = client.post("/new/upload", content=_form("b0undary", "0" * 64, data), headers=headers)
        assert forged.status_code == 403
        assert _file_ids(server) == before  # neither left a file behind

        stored = client.post("/new/upload", content=_form("b0undary", csrf, data), headers=headers)
        assert stored.status_code in (302, 303), stored.text[:500]
        (file_id,) = _file_ids(server) - before
        assert stored.headers["location"].endswith(file_id)
        assert server.http("GET", f"/files/{file_id}/content").content == data
