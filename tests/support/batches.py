"""Batches over plain HTTP, the way a client sends them: records and JSONL bytes, creates, reads of batches and
result files, error envelopes, keys, and what the test model's usage costs."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import httpx
import orjson

from tests.support.polling import TERMINAL, until_terminal, wait_for
from tests.support.server import Server

__all__ = ["BATCH_ID", "BLANK", "CHAT", "EMBEDDINGS", "ENVELOPE_KEYS", "FILE_ID", "TERMINAL", "batch_ids",
           "batch_usage", "chat", "cost", "create", "create_from_file", "embed", "error_of", "file_ids", "get",
           "jsonl", "line", "lines_of", "org_key", "post_batch", "post_batch_from", "prompt_text", "results",
           "revoke", "upload", "usage_of", "wait_for", "wait_letting_held_through", "without"]

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
ENVELOPE_KEYS = {"message", "type", "code", "param"}
FILE_ID = re.compile(r"^file-[0-9A-Za-z_-]+$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{12}$")
BLANK = b""  # a blank line in a jsonl(...) list
INPUT_RATE, OUTPUT_RATE = Decimal("0.30"), Decimal("1.20")  # test/echo, USD per Mtok
FACTOR = {"standard": Decimal("0.5"), "expedited": Decimal("0.75")}


# -- records ------------------------------------------------------------------------------------------------------

def chat(custom_id: Any, text: str = "hi", model: Any = "test/echo", **body: Any) -> dict[str, Any]:
    """A chat record; ``body`` fields are added to (or replace) the default body."""
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "messages": [{"role": "user", "content": text}], **body}}


def embed(custom_id: Any, text: str = "hi", model: Any = "test/echo", **body: Any) -> dict[str, Any]:
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


# -- creates ------------------------------------------------------------------------------------------------------

def upload(server: Server, content: bytes, api_key: str | None = None) -> str:
    resp = server.http("POST", "/files", api_key=api_key, files={"file": ("requests.jsonl", content)},
                       data={"purpose": "batch"})
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def post_batch(server: Server, api_key: str | None = None, **fields: Any) -> httpx.Response:
    """POST /v1/batches with ``fields`` (endpoint and completion_window default to chat and 24h): the answer,
    whatever it is."""
    body = {"endpoint": CHAT, "completion_window": "24h", **fields}
    return server.http("POST", "/batches", api_key=api_key, json=body)


def post_batch_from(server: Server, content: bytes, api_key: str | None = None, **fields: Any) -> httpx.Response:
    """Upload ``content`` and create a batch from it: the create's answer, whatever it is."""
    return post_batch(server, api_key=api_key, input_file_id=upload(server, content, api_key=api_key), **fields)


def create(server: Server, records: list[dict[str, Any]], *, endpoint: str = CHAT, priority: str | None = None,
           api_key: str | None = None, **fields: Any) -> dict[str, Any]:
    """Create a batch from inline requests (``fields``: more of the create's); returns the create answer (a 200,
    or the test fails)."""
    if priority is not None:
        fields["priority"] = priority
    response = post_batch(server, api_key=api_key, endpoint=endpoint, requests=records, **fields)
    assert response.status_code == 200, response.text
    return response.json()


def create_from_file(server: Server, records: list[dict[str, Any]], *, endpoint: str = CHAT) -> dict[str, Any]:
    """Upload the records as a JSONL file, then create the batch from it (a 200, or the test fails)."""
    response = post_batch_from(server, jsonl(*records), endpoint=endpoint)
    assert response.status_code == 200, response.text
    return response.json()


# -- reads --------------------------------------------------------------------------------------------------------

def get(server: Server, batch_id: str, api_key: str | None = None) -> dict[str, Any]:
    response = server.http("GET", f"/batches/{batch_id}", api_key=api_key)
    assert response.status_code == 200, response.text
    return response.json()


def batch_ids(server: Server, api_key: str | None = None) -> list[str]:
    resp = server.http("GET", "/batches?limit=100", api_key=api_key)
    assert resp.status_code == 200, resp.text
    return [b["id"] for b in resp.json()["data"]]


def file_ids(server: Server, api_key: str | None = None) -> set[str]:
    resp = server.http("GET", "/files", api_key=api_key)
    assert resp.status_code == 200, resp.text
    return {f["id"] for f in resp.json()["data"]}


def lines_of(server: Server, file_id: str | None, api_key: str | None = None) -> list[dict[str, Any]]:
    """A JSONL file's lines, parsed (none for no file): each line one JSON value, ended by a newline."""
    if file_id is None:
        return []
    resp = server.http("GET", f"/files/{file_id}/content", api_key=api_key)
    assert resp.status_code == 200, resp.text
    assert resp.content.endswith(b"\n") or not resp.content, resp.content[-200:]
    return [orjson.loads(raw) for raw in resp.content.splitlines()]


def results(server: Server, batch: dict[str, Any]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(output lines by custom_id, error lines by custom_id); fails on any custom_id seen twice."""
    out = lines_of(server, batch["output_file_id"])
    err = lines_of(server, batch["error_file_id"])
    ids = [line["custom_id"] for line in out + err]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert not repeated, f"custom_ids on more than one result line: {repeated[:20]}"
    return {line["custom_id"]: line for line in out}, {line["custom_id"]: line for line in err}


def wait_letting_held_through(server: Server, engine: Any, gate: str, batch_id: str, api_key: str | None = None,
                              timeout: float = 120.0) -> dict[str, Any]:
    """Wait for a cancelled batch to end, letting each request that reaches ``gate`` through once the server's
    worker has seen the cancel (its log says so). A worker may still start a record or two before it sees it; the
    gate stays closed until then, so every one started is counted by the engine, nothing finishes before the test
    lets it, and records that never started are left (however fast held requests could be let through)."""
    wait_for(lambda: f"batch {batch_id}: cancelling" in server.log(), "the worker to see the cancel", timeout=timeout)

    def let_held_through() -> None:
        if held := engine.held(gate):
            engine.release(gate, count=held)

    return until_terminal(lambda: server.http("GET", f"/batches/{batch_id}", api_key=api_key).json(),
                          f"batch {batch_id}", timeout=timeout, meanwhile=let_held_through)


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


# -- keys ---------------------------------------------------------------------------------------------------------

def org_key(server: Server, org: str, *extra: str) -> str:
    """Another key of an existing organization, made with `orl admin` (every scope unless ``extra`` says
    otherwise)."""
    done = server.admin("key", "create", "--org", org, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def revoke(server: Server, org: str, secret: str) -> None:
    listed = server.admin("key", "list", "--org", org)
    assert listed.returncode == 0, listed.stderr
    (key_id,) = [k["id"] for k in orjson.loads(listed.stdout) if secret.startswith(k["prefix"])]
    done = server.admin("key", "revoke", key_id)
    assert done.returncode == 0, done.stderr


# -- usage and cost -----------------------------------------------------------------------------------------------

def prompt_text(request: dict[str, Any]) -> str:
    """The text a recorded engine request carried: the last user message, the prompt or the input."""
    body = request["body"] or {}
    if "messages" in body:
        return next(m["content"] for m in reversed(body["messages"]) if m.get("role") == "user")
    if "prompt" in body:
        return body["prompt"]
    raw = body.get("input")
    return raw if isinstance(raw, str) else " ".join(map(str, raw or []))


def cost(prompt_tokens: int, completion_tokens: int, priority: str = "standard") -> int:
    raw = (prompt_tokens * INPUT_RATE + completion_tokens * OUTPUT_RATE) * 1000 * FACTOR[priority]
    return int(raw.to_integral_value(ROUND_HALF_EVEN))


def batch_usage(input_tokens: int = 0, output_tokens: int = 0, cost_nano_usd: int = 0, *, cached_tokens: int = 0,
                reasoning_tokens: int = 0) -> dict[str, Any]:
    """A batch's ``usage`` object as the API shows it (the OpenAI SDK's ``BatchUsage`` and ``cost_nano_usd``)."""
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens, "cost_nano_usd": cost_nano_usd}


def usage_of(lines: dict[str, dict], priority: str = "standard") -> dict[str, Any]:
    """The batch usage the output lines add up to (test/echo's rates: no cached rate, so cached tokens cost the
    input rate)."""
    pt = ct = cached = reasoning = nano = 0
    for line in lines.values():
        usage = line["response"]["body"]["usage"]
        # Chat and text completions count prompt/completion tokens; the Responses API input/output tokens.
        p = usage.get("prompt_tokens", usage.get("input_tokens", 0))
        c = usage.get("completion_tokens", usage.get("output_tokens", 0))
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        thinking = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
        cached += details.get("cached_tokens", 0)
        reasoning += thinking.get("reasoning_tokens", 0)
        pt, ct, nano = pt + p, ct + c, nano + cost(p, c, priority)
    return batch_usage(pt, ct, nano, cached_tokens=cached, reasoning_tokens=reasoning)
