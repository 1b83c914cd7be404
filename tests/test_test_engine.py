"""Tests for the OpenAI-compatible test engine used as a stand-in inference server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.support.test_engine import running_test_engine


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    with running_test_engine() as base_url:
        yield base_url


@pytest.fixture()
def client(engine_url: str) -> Iterator[httpx.Client]:
    root = engine_url.removesuffix("/v1")
    with httpx.Client(base_url=root, timeout=10) as c:
        c.post("/control/reset").raise_for_status()  # module-scoped engine: isolate each test
        yield c


def chat(client: httpx.Client, text: str) -> httpx.Response:
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": text}]
    return client.post("/v1/chat/completions", json={"model": "m", "messages": messages})


def test_chat_echo_and_usage(client: httpx.Client) -> None:
    r = chat(client, "hello there world")
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "chat.completion" and data["model"] == "m"
    assert data["id"].startswith("chatcmpl-")
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello there world"}
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_chat_content_parts_and_tokens_directive(client: httpx.Client) -> None:
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "#tokens=42"}]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    r = client.post("/v1/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] == "echo: hi #tokens=42"
    assert r.json()["usage"]["completion_tokens"] == 42


def test_completions_and_embeddings(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "m", "prompt": "a b"})
    assert r.json()["choices"][0]["text"] == "echo: a b"
    assert r.json()["usage"]["prompt_tokens"] == 2
    r1 = client.post("/v1/embeddings", json={"model": "e", "input": ["x y", "z"]}).json()
    r2 = client.post("/v1/embeddings", json={"model": "e", "input": "x y"}).json()
    assert [d["index"] for d in r1["data"]] == [0, 1]
    assert len(r1["data"][0]["embedding"]) == 8
    assert r1["data"][0]["embedding"] == r2["data"][0]["embedding"]
    assert r1["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_missing_messages_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"model": "m"})
    assert r.status_code == 400
    error = {"message": "messages: field required", "type": "invalid_request_error"}
    assert r.json() == {"error": {**error, "param": None, "code": None}}


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (500, "server_error")])
def test_status_directive(client: httpx.Client, status: int, kind: str) -> None:
    r = chat(client, f"please #status={status} now")
    assert r.status_code == status
    assert r.json()["error"]["type"] == kind


def test_fail_times(client: httpx.Client) -> None:
    codes = [chat(client, "flaky #fail_times=2").status_code for _ in range(3)]
    assert codes == [500, 500, 200]


def test_requests_are_recorded(client: httpx.Client) -> None:
    chat(client, "one")
    client.post("/v1/completions", json={"model": "m", "prompt": "two"})
    recorded = client.get("/control/requests").json()
    assert [r["path"] for r in recorded] == ["/v1/chat/completions", "/v1/completions"]
    assert recorded[0]["body"]["messages"][1]["content"] == "one"
    assert recorded[1]["body"] == {"model": "m", "prompt": "two"}
    assert client.get("/control/stats").json()["requests"] == 2


def test_mode(client: httpx.Client) -> None:
    client.post("/control/mode", json={"status": 503}).raise_for_status()
    r = chat(client, "x")
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    client.post("/control/mode", json={"status": None}).raise_for_status()
    assert chat(client, "x").status_code == 200
    client.post("/control/mode", json={"delay": 0.3}).raise_for_status()
    assert chat(client, "x").elapsed.total_seconds() >= 0.3
    client.post("/control/reset").raise_for_status()
    assert chat(client, "x").elapsed.total_seconds() < 0.3


def test_max_in_flight(client: httpx.Client, engine_url: str) -> None:
    async def burst() -> None:
        async with httpx.AsyncClient(base_url=engine_url, timeout=10) as ac:
            body = {"model": "m", "messages": [{"role": "user", "content": "slow #sleep=0.3"}]}
            rs = await asyncio.gather(*(ac.post("/chat/completions", json=body) for _ in range(8)))
            assert all(r.status_code == 200 for r in rs)

    asyncio.run(burst())
    stats = client.get("/control/stats").json()
    timing = {k: stats.pop(k) for k in ("first_at", "last_at")}
    assert stats == {"requests": 8, "in_flight": 0, "max_in_flight": 8}
    assert timing["last_at"] - timing["first_at"] > 0


def test_no_record_flag() -> None:
    with running_test_engine("--no-record") as base_url:
        with httpx.Client(base_url=base_url, timeout=10) as c:
            assert c.post("/completions", json={"model": "m", "prompt": "p"}).status_code == 200
            assert c.get("/models").json() == {"object": "list", "data": []}
            root = base_url.removesuffix("/v1")
            assert c.get(f"{root}/control/requests").json() == []
            assert c.get(f"{root}/health").json() == {"ok": True}
