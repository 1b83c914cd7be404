"""The Files API (docs/api-contract.md §1 and §2): upload, list, retrieve, download, delete, limits and isolation."""

from __future__ import annotations

import hashlib
import io
import os
import secrets

import openai
import orjson
import pytest

from tests.support.batches import error_of

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def _record(custom_id: str, text: str, **body: object) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "test/echo", "messages": [{"role": "user", "content": text}], **body}})


def _jsonl(n: int, prefix: str = "req") -> bytes:
    return b"".join(_record(f"{prefix}-{i}", f"hello {i}") + b"\n" for i in range(n))


def _upload(client: openai.OpenAI, content: bytes, name: str = "requests.jsonl"):
    return client.files.create(file=(name, io.BytesIO(content), "application/jsonl"), purpose="batch")


def _form(file: bytes | None, purpose: str | None, filename: str = "requests.jsonl") -> tuple[str, bytes]:
    """A multipart/form-data body built by hand, so a test can send it whole or chunked."""
    boundary = f"orl-{secrets.token_hex(8)}"
    parts = []
    if purpose is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'.encode())
    if file is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                     "Content-Type: application/octet-stream\r\n\r\n".encode() + file + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", b"".join(parts)


def _chunked(body: bytes, size: int = 64 * 1024):
    for i in range(0, len(body), size):
        yield body[i : i + size]


def _blob_files(server) -> set[str]:
    """Everything under the blob store's files/ folder, temporary files included."""
    root = server.data_dir / "blobs" / "files"
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _ids(page: dict) -> list[str]:
    return [f["id"] for f in page["data"]]


# -- the SDK round trip ---------------------------------------------------------------------------------------


def test_sdk_create_retrieve_list_content_delete(server):
    others = _blob_files(server)  # other tests' files on this module's server
    client = server.client()
    content = _jsonl(3)
    created = _upload(client, content, name="mine.jsonl")
    assert created.id.startswith("file-")
    assert created.object == "file" and created.purpose == "batch" and created.filename == "mine.jsonl"
    assert created.bytes == len(content) and created.created_at > 0

    got = client.files.retrieve(created.id)
    assert got.model_dump() == created.model_dump()
    raw = server.http("GET", f"/files/{created.id}").json()
    assert raw == {"id": created.id, "object": "file", "bytes": len(content), "created_at": created.created_at,
                   "expires_at": None, "filename": "mine.jsonl", "purpose": "batch", "status": "processed",
                   "status_details": None}

    assert client.files.content(created.id).content == content
    assert [f.id for f in client.files.list()] == [created.id]

    deleted = client.files.delete(created.id)
    assert deleted.id == created.id and deleted.deleted is True and deleted.object == "file"

    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(created.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(created.id)
    assert list(client.files.list()) == []
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        error_of(server.http(method, f"/files/{created.id}{path}"), 404, "not_found", "file_id")
    assert _blob_files(server) == others  # the bytes went with the file


def test_repeated_upload_stores_a_new_file(server):
    client = server.client()
    first, second = _upload(client, b"same\n"), _upload(client, b"same\n")
    assert first.id != second.id
    assert client.files.content(first.id).content == client.files.content(second.id).content == b"same\n"


# -- listing --------------------------------------------------------------------------------------------------


def test_list_newest_first_with_paging(server):
    client = server.client()
    uploaded = [_upload(client, f"file {i}\n".encode(), name=f"f{i}.jsonl").id for i in range(5)]
    newest_first = uploaded[::-1]

    page = server.http("GET", "/files", params={"limit": 2}).json()
    assert page["object"] == "list"
    assert _ids(page) == newest_first[:2]
    assert page["first_id"] == newest_first[0] and page["last_id"] == newest_first[1]
    assert page["has_more"] is True

    page = server.http("GET", "/files", params={"limit": 2, "after": page["last_id"]}).json()
    assert _ids(page) == newest_first[2:4]
    assert page["first_id"] == newest_first[2] and page["last_id"] == newest_first[3]
    assert page["has_more"] is True

    page = server.http("GET", "/files", params={"limit": 2, "after": page["last_id"]}).json()
    assert _ids(page) == newest_first[4:]
    assert page["first_id"] == page["last_id"] == newest_first[4]
    assert page["has_more"] is False

    # Exactly `limit` left is not "more".
    page = server.http("GET", "/files", params={"limit": 1, "after": newest_first[3]}).json()
    assert _ids(page) == newest_first[4:] and page["has_more"] is False

    page = server.http("GET", "/files", params={"after": newest_first[-1]}).json()
    assert page == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}

    everything = server.http("GET", "/files").json()
    assert _ids(everything) == newest_first and everything["has_more"] is False

    # The SDK pages through on its own.
    assert [f.id for f in client.files.list(limit=2)] == newest_first

    error_of(server.http("GET", "/files", params={"limit": 0}), 400, "invalid_request_error", "limit")


def test_list_oldest_first_with_order_asc_and_any_other_order_is_a_400(server):
    client = server.client()
    uploaded = [_upload(client, f"file {i}\n".encode(), name=f"f{i}.jsonl").id for i in range(3)]
    assert [f.id for f in client.files.list(order="asc", limit=2)] == uploaded  # the SDK pages on by `after`
    assert [f.id for f in client.files.list(order="desc", limit=2)] == uploaded[::-1]
    page = server.http("GET", "/files", params={"order": "asc", "limit": 1, "after": uploaded[0]}).json()
    assert _ids(page) == uploaded[1:2] and page["has_more"] is True
    for wrong in ("ASC", "oldest", ""):
        error = error_of(server.http("GET", "/files", params={"order": wrong}), 400, "invalid_request_error", "order")
        assert error["message"] == f'order must be "asc" (oldest first) or "desc" (newest first); got {wrong!r}'


def test_list_purpose_filter(server):
    client = server.client()
    mine = _upload(client, _jsonl(2)).id
    # A create that rejects a record writes a rejections file of purpose batch_output.
    created = server.http("POST", "/batches", json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "requests": [orjson.loads(_record("ok", "hi")), orjson.loads(_record("bad", "hi", stream=True))],
    })
    assert created.status_code == 200, created.text
    rejections = created.json()["rejected_records_file_id"]
    inline_input = created.json()["input_file_id"]
    # Finalized, the batch adds its output and error files, batch_output too.
    done = server.wait(created.json()["id"])
    assert done["status"] == "completed"
    results = {done["output_file_id"], done["error_file_id"]}
    assert None not in results

    batch_files = server.http("GET", "/files", params={"purpose": "batch"}).json()
    assert rejections not in _ids(batch_files)
    assert mine in _ids(batch_files) and inline_input in _ids(batch_files)
    assert {f["purpose"] for f in batch_files["data"]} == {"batch"}

    outputs = server.http("GET", "/files", params={"purpose": "batch_output"}).json()
    assert sorted(_ids(outputs)) == sorted({rejections} | results)
    assert _ids(outputs)[-1] == rejections  # newest first: the result files came after the create
    assert {f["purpose"] for f in outputs["data"]} == {"batch_output"}

    assert [f.id for f in client.files.list(purpose="batch_output")] == _ids(outputs)
    assert server.http("GET", "/files", params={"purpose": "fine-tune"}).json()["data"] == []
    assert set(_ids(server.http("GET", "/files").json())) == {mine, rejections, inline_input} | results


# -- content --------------------------------------------------------------------------------------------------


def test_multi_megabyte_content_is_byte_identical(server):
    client = server.client()
    # Random bytes: every byte value, CR/LF pairs and NULs included; nothing may be rewritten on the way.
    content = os.urandom(5 * 1024 * 1024 + 17)
    created = _upload(client, content, name="big.bin")
    assert created.bytes == len(content)

    downloaded = client.files.content(created.id).content
    assert len(downloaded) == len(content)
    assert hashlib.sha256(downloaded).hexdigest() == hashlib.sha256(content).hexdigest()

    resp = server.http("GET", f"/files/{created.id}/content")
    assert resp.status_code == 200
    assert int(resp.headers["content-length"]) == len(content)
    assert resp.content == content


# -- refused uploads ------------------------------------------------------------------------------------------


def test_upload_over_the_limit_is_413_and_leaves_nothing(make_server):
    limit = 1_000_000
    server = make_server(env={"OPENRELAY_MAX_UPLOAD_BYTES": str(limit)})
    client = server.client()
    kept = _upload(client, b"x" * limit, name="at-the-limit.bin")  # exactly the limit is allowed
    assert kept.bytes == limit
    before = _blob_files(server)
    assert before == {kept.id}

    # Declared length over the limit.
    content_type, body = _form(os.urandom(2 * 1024 * 1024), "batch")
    resp = server.http("POST", "/files", content=body, headers={"content-type": content_type})
    error = error_of(resp, 413, "file_too_large", "file")
    assert "limit" in error["message"]

    # No declared length (chunked): the limit holds while the bytes stream in, to the byte.
    for size in (2 * 1024 * 1024, limit + 1):
        content_type, body = _form(b"y" * size, "batch")
        resp = server.http("POST", "/files", content=_chunked(body), headers={"content-type": content_type})
        assert "content-length" not in resp.request.headers
        error_of(resp, 413, "file_too_large", "file")

    # The SDK sees an ordinary API error.
    with pytest.raises(openai.APIStatusError) as caught:
        _upload(client, os.urandom(2 * 1024 * 1024))
    assert caught.value.status_code == 413
    assert caught.value.body["code"] == "file_too_large"

    assert [f.id for f in client.files.list()] == [kept.id]
    assert _blob_files(server) == before
    assert client.files.content(kept.id).content == b"x" * limit


def test_wrong_or_missing_purpose_is_400(server):
    others = _blob_files(server)  # other tests' files on this module's server
    client = server.client()
    for purpose in ("fine-tune", "", None):
        content_type, body = _form(b"{}\n", purpose)
        resp = server.http("POST", "/files", content=body, headers={"content-type": content_type})
        error_of(resp, 400, "invalid_request_error", "purpose")
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("r.jsonl", io.BytesIO(b"{}\n")), purpose="assistants")
    assert caught.value.body["param"] == "purpose"
    assert list(client.files.list()) == []
    assert _blob_files(server) == others


def test_missing_file_part_is_400(server):
    others = _blob_files(server)  # other tests' files on this module's server
    content_type, body = _form(None, "batch")
    resp = server.http("POST", "/files", content=body, headers={"content-type": content_type})
    error_of(resp, 400, "invalid_request_error", "file")
    # Not a form at all.
    resp = server.http("POST", "/files", json={"purpose": "batch", "file": "{}"})
    error_of(resp, 400, "invalid_request_error", None)
    assert list(server.client().files.list()) == []
    assert _blob_files(server) == others


# -- identity -------------------------------------------------------------------------------------------------


def test_other_organization_sees_a_404_like_an_unknown_id(server):
    mine = _upload(server.client(), b"secret\n")
    other_key = server.new_org_key()
    other = server.client(api_key=other_key)
    unknown = "file-" + "0" * 24

    for method, suffix in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        theirs = server.http(method, f"/files/{mine.id}{suffix}", api_key=other_key)
        nobody = server.http(method, f"/files/{unknown}{suffix}", api_key=other_key)
        error_of(theirs, 404, "not_found", "file_id")
        expected = nobody.json()
        expected["error"]["message"] = expected["error"]["message"].replace(unknown, mine.id)
        assert theirs.json() == expected

    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.files.delete(mine.id)
    assert list(other.files.list()) == []
    error_of(server.http("GET", "/files", params={"after": mine.id}, api_key=other_key), 404, "not_found", "after")

    # The other organization's own file is invisible the other way round.
    theirs = _upload(other, b"theirs\n")
    assert [f.id for f in server.client().files.list()] == [mine.id]
    assert [f.id for f in other.files.list()] == [theirs.id]
    # Nothing the other organization tried touched the file.
    assert server.client().files.content(mine.id).content == b"secret\n"


def test_no_or_unknown_key_is_401(server):
    others = _blob_files(server)  # other tests' files on this module's server
    mine = _upload(server.client(), b"x\n")
    content_type, body = _form(b"x\n", "batch")
    calls = [("GET", "/files", {}), ("GET", f"/files/{mine.id}", {}), ("GET", f"/files/{mine.id}/content", {}),
             ("DELETE", f"/files/{mine.id}", {}),
             ("POST", "/files", {"content": body, "headers": {"content-type": content_type}})]
    for api_key in ("", "orl-not-a-real-key"):
        for method, path, kwargs in calls:
            error_of(server.http(method, path, api_key=api_key, **kwargs), 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="orl-not-a-real-key").files.list()
    assert [f.id for f in server.client().files.list()] == [mine.id]
    assert _blob_files(server) == others | {mine.id}


def test_missing_scope_is_403(server):
    read_only = server.new_org_key(None, "--scopes", "files.read,batch.read")
    write_only = server.new_org_key(None, "--scopes", "files.write")

    def forbidden(resp):
        error = error_of(resp, 403, "insufficient_scope", None, type_="permission_error")
        return error["message"]

    content_type, body = _form(b"x\n", "batch")
    assert "files.write" in forbidden(server.http("POST", "/files", api_key=read_only, content=body,
                                                  headers={"content-type": content_type}))
    with pytest.raises(openai.PermissionDeniedError):
        _upload(server.client(api_key=read_only), b"x\n")

    written = _upload(server.client(api_key=write_only), b"x\n")
    assert "files.read" in forbidden(server.http("GET", "/files", api_key=write_only))
    assert "files.read" in forbidden(server.http("GET", f"/files/{written.id}", api_key=write_only))
    assert "files.read" in forbidden(server.http("GET", f"/files/{written.id}/content", api_key=write_only))
    with pytest.raises(openai.PermissionDeniedError):
        server.client(api_key=write_only).files.list()

    assert list(server.client(api_key=read_only).files.list()) == []
    assert "files.write" in forbidden(server.http("DELETE", f"/files/{written.id}", api_key=read_only))
    # The write-only key could delete its own file; the refusals above left it in place.
    assert server.client(api_key=write_only).files.delete(written.id).deleted is True
