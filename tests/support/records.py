"""Batch inputs for create tests: records, JSONL bytes, and the create and read calls over raw HTTP."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson

from tests.support.server import Server

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
ENVELOPE_KEYS = {"message", "type", "code", "param"}
FILE_ID = re.compile(r"^file-[0-9A-Za-z_-]+$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{12}$")
BLANK = b""  # a blank line in a jsonl(...) list


def chat(custom_id: Any, model: Any = "test/echo", text: str = "hi", **body: Any) -> dict[str, Any]:
    """A chat record; ``body`` fields are added to (or replace) the default body."""
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "messages": [{"role": "user", "content": text}], **body}}


def embed(custom_id: Any, model: Any = "test/echo", text: str = "hi", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS,
            "body": {"model": model, "input": text, **body}}


def without(record: dict[str, Any], *path: str) -> dict[str, Any]:
    """A deep-enough copy of ``record`` with the key at ``path`` (e.g. "body", "model") removed."""
    copy = orjson.loads(orjson.dumps(record))
    target = copy
    for part in path[:-1]:
        target = target[part]
    del target[path[-1]]
    return copy


def line(item: dict[str, Any] | list[Any] | bytes) -> bytes:
    return item if isinstance(item, bytes) else orjson.dumps(item)


def jsonl(*items: dict[str, Any] | list[Any] | bytes) -> bytes:
    """One line per item (dicts are serialized, bytes are sent as they are, BLANK is a blank line)."""
    return b"".join(line(item) + b"\n" for item in items)


def upload(server: Server, content: bytes, api_key: str | None = None) -> str:
    resp = server.http("POST", "/files", api_key=api_key, files={"file": ("requests.jsonl", content)},
                       data={"purpose": "batch"})
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def create(server: Server, api_key: str | None = None, **fields: Any) -> httpx.Response:
    """POST /v1/batches with ``fields`` (endpoint and completion_window default to chat and 24h)."""
    body = {"endpoint": CHAT, "completion_window": "24h", **fields}
    return server.http("POST", "/batches", api_key=api_key, json=body)


def create_from(server: Server, content: bytes, api_key: str | None = None, **fields: Any) -> httpx.Response:
    """Upload ``content`` and create a batch from it."""
    return create(server, api_key=api_key, input_file_id=upload(server, content, api_key=api_key), **fields)


def batch_ids(server: Server, api_key: str | None = None) -> list[str]:
    resp = server.http("GET", "/batches?limit=100", api_key=api_key)
    assert resp.status_code == 200, resp.text
    return [b["id"] for b in resp.json()["data"]]


def file_ids(server: Server, api_key: str | None = None) -> set[str]:
    resp = server.http("GET", "/files", api_key=api_key)
    assert resp.status_code == 200, resp.text
    return {f["id"] for f in resp.json()["data"]}


def content_lines(server: Server, file_id: str, api_key: str | None = None) -> list[dict[str, Any]]:
    resp = server.http("GET", f"/files/{file_id}/content", api_key=api_key)
    assert resp.status_code == 200, resp.text
    assert resp.content.endswith(b"\n")
    return [orjson.loads(raw) for raw in resp.content.splitlines()]


def error_of(resp: httpx.Response, status: int, code: str | None, param: str | None = None,
             type_: str = "invalid_request_error") -> dict[str, Any]:
    """The error object of an OpenAI-envelope answer, after checking its status, code, type and param."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert ENVELOPE_KEYS <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert (error["code"], error["type"], error["param"]) == (code, type_, param), error
    return error


def org_key(server: Server, org: str, *extra: str) -> str:
    """Another key of an existing organization (every scope unless ``extra`` says otherwise)."""
    done = server.admin("key", "create", "--org", org, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def revoke(server: Server, org: str, secret: str) -> None:
    listed = server.admin("key", "list", "--org", org)
    assert listed.returncode == 0, listed.stderr
    (key_id,) = [k["id"] for k in orjson.loads(listed.stdout) if secret.startswith(k["prefix"])]
    done = server.admin("key", "revoke", key_id)
    assert done.returncode == 0, done.stderr
