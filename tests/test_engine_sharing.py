"""Sharing an engine with interactive traffic (docs/engines.md): a batch sent at the engine's low priority
(``engine_priority``), stepping aside while others' requests wait on the engine (``load_metrics``,
``yield_to_interactive``), and running on as before when the engine's metrics fail or lie. Through `orl serve` and
separate `orl worker` processes against the test engine, with others' requests sent straight to it."""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.support import http_client
from tests.support.batches import chat, create
from tests.support.server import catalog_text


def sharing_catalog(engine_url: str, knobs: str, *, concurrency: int = 2) -> str:
    """The test catalog, its test/echo engine given ``knobs`` (TOML inline-table entries)."""
    text = catalog_text(engine_url, slots=1, concurrency=concurrency)
    assert text.count("timeout_seconds = 30 }") == 1
    return text.replace("timeout_seconds = 30 }", f"timeout_seconds = 30, {knobs} }}")


def metric(server, name: str, **labels: str) -> float | None:
    text = http_client.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}\{{[^}}]*{wanted}[^}}]*\}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def batch_texts(engine) -> list[str]:
    """The user texts of the calls the engine got from OpenRelay (its served model name marks them)."""
    return [r["body"]["messages"][-1]["content"] for r in engine.requests()
            if r["path"] == "/v1/chat/completions" and r["body"].get("model") == "echo-served"]


class Interactive:
    """Others' chat requests sent straight to the engine, each on a thread until its answer comes."""

    def __init__(self, engine_url: str) -> None:
        self.url = engine_url.rstrip("/") + "/chat/completions"
        self.pool = ThreadPoolExecutor(max_workers=8)

    def send(self, text: str) -> Future:
        body = {"model": "chat-user", "messages": [{"role": "user", "content": text}]}
        return self.pool.submit(lambda: http_client.post(self.url, json=body, timeout=60).status_code)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def interactive(engine_url):
    users = Interactive(engine_url)
    yield users
    users.close()


def test_engine_priority_is_sent_as_every_calls_priority(make_server, engine, engine_url):
    server = make_server(catalog=sharing_catalog(engine_url, "engine_priority = 7"))
    # A record's own priority is replaced: a batch user cannot put the batch ahead of the interactive traffic.
    batch = server.wait(create(server, [chat("a", "first"), chat("b", "second", priority=-100)])["id"])
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    sent = [r["body"] for r in engine.requests() if r["path"] == "/v1/chat/completions"]
    assert sorted((b["messages"][0]["content"], b["priority"]) for b in sent) == [("first", 7), ("second", 7)]
