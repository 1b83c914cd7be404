"""Helpers for the execution tests: build records, create batches over HTTP, read result files back."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, TypeVar

import orjson

from tests.support.server import Server

T = TypeVar("T")

TERMINAL = ("completed", "failed", "expired", "cancelled")
INPUT_RATE, OUTPUT_RATE = Decimal("0.30"), Decimal("1.20")  # test/echo, USD per Mtok
FACTOR = {"standard": Decimal("0.5"), "expedited": Decimal("0.75")}


def chat(custom_id: str, text: str, model: str = "test/echo") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def create(server: Server, records: list[dict[str, Any]], *, endpoint: str = "/v1/chat/completions",
           priority: str | None = None) -> dict[str, Any]:
    """Create a batch from inline requests over plain HTTP; returns the create answer."""
    body: dict[str, Any] = {"endpoint": endpoint, "completion_window": "24h", "requests": records}
    if priority is not None:
        body["priority"] = priority
    response = server.http("POST", "/batches", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def create_from_file(server: Server, records: list[dict[str, Any]], *,
                     endpoint: str = "/v1/chat/completions") -> dict[str, Any]:
    """Upload the records as a JSONL file, then create the batch from it."""
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    up = server.http("POST", "/files", files={"file": ("input.jsonl", data)}, data={"purpose": "batch"})
    assert up.status_code == 200, up.text
    response = server.http("POST", "/batches", json={"input_file_id": up.json()["id"], "endpoint": endpoint,
                                                     "completion_window": "24h"})
    assert response.status_code == 200, response.text
    return response.json()


def get(server: Server, batch_id: str) -> dict[str, Any]:
    response = server.http("GET", f"/batches/{batch_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 60.0, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; return that."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_letting_held_through(server: Server, engine: Any, gate: str, batch_id: str, api_key: str | None = None,
                              timeout: float = 120.0) -> dict[str, Any]:
    """Wait for a cancelled batch to end, letting each request that reaches ``gate`` through. A worker may still
    start a record or two before it sees the cancel; the gate stays closed, so every one started is counted by
    the engine and nothing finishes before the test lets it."""
    deadline = time.time() + timeout
    while True:
        batch = server.http("GET", f"/batches/{batch_id}", api_key=api_key).json()
        if batch["status"] in TERMINAL:
            return batch
        assert time.time() < deadline, f"batch {batch_id} not terminal after {timeout}s: {batch}"
        if held := engine.held(gate):
            engine.release(gate, count=held)
        time.sleep(0.05)


def lines_of(server: Server, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = server.http("GET", f"/files/{file_id}/content")
    assert response.status_code == 200, response.text
    return [orjson.loads(raw) for raw in response.content.splitlines() if raw.strip()]


def results(server: Server, batch: dict[str, Any]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(output lines by custom_id, error lines by custom_id); fails on any custom_id seen twice."""
    out = lines_of(server, batch["output_file_id"])
    err = lines_of(server, batch["error_file_id"])
    ids = [line["custom_id"] for line in out + err]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert not repeated, f"custom_ids on more than one result line: {repeated[:20]}"
    return {line["custom_id"]: line for line in out}, {line["custom_id"]: line for line in err}


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
