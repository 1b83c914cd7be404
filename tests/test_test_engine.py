"""Tests for the OpenAI-compatible test engine used as a stand-in inference server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import httpx
import pytest

from tests.support.test_engine import EngineControl, running_test_engine


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
    assert client.post("/control/mode", json={}).json() == {"status": None, "delay": 0.0}


def test_max_in_flight(client: httpx.Client, engine_url: str) -> None:
    root = engine_url.removesuffix("/v1")

    async def burst() -> None:
        async with httpx.AsyncClient(base_url=engine_url, timeout=10) as ac:
            body = {"model": "m", "messages": [{"role": "user", "content": "slow #hold=burst"}]}
            calls = [asyncio.create_task(ac.post("/chat/completions", json=body)) for _ in range(8)]
            while (await ac.get(f"{root}/control/held")).json().get("burst", {}).get("waiting") != 8:
                await asyncio.sleep(0.01)
            await ac.post(f"{root}/control/release", json={"name": "burst"})
            assert all(r.status_code == 200 for r in await asyncio.gather(*calls))

    asyncio.run(burst())
    stats = client.get("/control/stats").json()
    timing = {k: stats.pop(k) for k in ("first_at", "last_at")}
    assert stats == {"requests": 8, "in_flight": 0, "max_in_flight": 8, "prompt_tokens": 16, "cached_tokens": 0,
                     "too_many_requests": 0, "service_seconds": 0.0, "running": 0, "waiting": 0, "max_waiting": 0,
                     "preemptions": 0}
    assert timing["last_at"] - timing["first_at"] > 0


def test_no_record_flag() -> None:
    with running_test_engine("--no-record") as base_url:
        with httpx.Client(base_url=base_url, timeout=10) as c:
            assert c.post("/completions", json={"model": "m", "prompt": "p"}).status_code == 200
            assert c.get("/models").json() == {"object": "list", "data": []}
            root = base_url.removesuffix("/v1")
            assert c.get(f"{root}/control/requests").json() == []
            assert c.get(f"{root}/health").json() == {"ok": True}


def test_hold_waits_until_released(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)

    async def held_then_released() -> list[str]:
        async with httpx.AsyncClient(base_url=engine_url, timeout=10) as ac:
            body = {"model": "m", "messages": [{"role": "user", "content": "wait #hold=g1"}]}
            calls = [asyncio.create_task(ac.post("/chat/completions", json=body)) for _ in range(3)]
            while (await ac.get(f"{control.root}/control/held")).json().get("g1", {}).get("waiting") != 3:
                await asyncio.sleep(0.01)
            assert not any(call.done() for call in calls)
            await ac.post(f"{control.root}/control/release", json={"name": "g1", "count": 1})
            done, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1
            while (await ac.get(f"{control.root}/control/held")).json()["g1"]["waiting"] != 2:
                await asyncio.sleep(0.01)
            assert len(pending) == 2 and not any(call.done() for call in pending)
            await ac.post(f"{control.root}/control/release", json={"name": "g1"})
            rs = await asyncio.gather(*calls)
            later = await ac.post("/chat/completions", json=body)  # an opened gate stays open
            return [r.json()["choices"][0]["message"]["content"] for r in [*rs, later]]

    assert asyncio.run(held_then_released()) == ["echo: wait #hold=g1"] * 4
    assert control.gates() == {"g1": {"waiting": 0, "passed": 4, "open": True}}


def test_hold_helpers_and_reset_let_held_requests_go(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)
    control.release("early")  # opened before any request reaches it
    assert chat(client, "x #hold=early").status_code == 200
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(chat, client, f"x #hold={name}") for name in ("a", "a", "b")]
        control.wait_held("a", 2)
        control.wait_held("b", 1)
        assert control.held("a") == 2 and control.held("nothing") == 0
        assert not any(call.done() for call in calls)
        control.reset()
        assert [call.result(timeout=10).status_code for call in calls] == [200, 200, 200]
    assert control.gates() == {}  # reset closed and forgot every gate
    with pytest.raises(AssertionError, match="0 requests held at 'a'"):
        control.wait_held("a", 1, timeout=0.2)


# -- the simulation of a real engine's capacity: prefix cache, service time, knee, 429s ------------------------


def complete(client: httpx.Client, prompt: str) -> dict:
    r = client.post("/v1/completions", json={"model": "m", "prompt": prompt})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def cached(client: httpx.Client, prompt: str) -> int:
    return complete(client, prompt)["prompt_tokens_details"]["cached_tokens"]


def test_prefix_cache_counts_the_leading_blocks_found(client: httpx.Client) -> None:
    config = EngineControl(str(client.base_url) + "/v1").config(cache_blocks=3, block_tokens=4)
    assert config["cache_blocks"] == 3 and config["block_tokens"] == 4
    assert complete(client, "a b c d e f g h i") == {  # 9 tokens: two whole blocks, [a b c d] and [e f g h]
        "prompt_tokens": 9, "completion_tokens": 10, "total_tokens": 19, "prompt_tokens_details": {"cached_tokens": 0}}
    assert cached(client, "a b c d e f g h i") == 8
    assert cached(client, "a b c d x y z w v") == 4  # the second block follows another prefix: a block of its own
    assert cached(client, "a b c d e f g h") == 4  # found in full, yet its last token is computed again
    assert cached(client, "x b c d e f g h i") == 0  # the same words after another first block are no hit
    stats = client.get("/control/stats").json()
    assert (stats["prompt_tokens"], stats["cached_tokens"]) == (9 + 9 + 9 + 8 + 9, 0 + 8 + 4 + 4 + 0)


def test_prefix_cache_evicts_the_least_recently_used_blocks_last_block_first(client: httpx.Client) -> None:
    client.post("/control/config", json={"cache_blocks": 3, "block_tokens": 4}).raise_for_status()
    first, second = "a b c d e f g h i", "q r s t u v w x y"
    assert cached(client, first) == 0
    assert cached(client, second) == 0  # 4 blocks for 3 places: the first prompt's tail block goes, its head stays
    assert cached(client, first) == 4  # its tail back in, the second prompt's tail out
    assert cached(client, second) == 4
    client.post("/control/config", json={"cache_blocks": 4}).raise_for_status()  # a new size: an empty cache
    assert cached(client, second) == 0
    client.post("/control/config", json={"prefill_seconds_per_token": 0}).raise_for_status()  # the cache stays
    assert cached(client, second) == 8


def test_chat_and_responses_report_cached_tokens(client: httpx.Client) -> None:
    client.post("/control/config", json={"cache_blocks": 16, "block_tokens": 2}).raise_for_status()
    document = "the long document that every question shares"  # with "be nice" and "question N": 5 whole blocks
    usages = [chat(client, f"{document} question {i}").json()["usage"] for i in range(2)]
    assert [u["prompt_tokens"] for u in usages] == [11, 11]
    assert [u["prompt_tokens_details"] for u in usages] == [{"cached_tokens": 0}, {"cached_tokens": 10}]
    body = {"model": "m", "instructions": "be nice", "input": f"{document} question 2"}
    usage = client.post("/v1/responses", json=body).json()["usage"]
    assert usage["input_tokens"] == 11
    assert usage["input_tokens_details"]["cached_tokens"] == 10
    assert client.get("/control/stats").json()["cached_tokens"] == 20


def test_config_is_checked_and_reset_restores_it(client: httpx.Client) -> None:
    defaults = client.get("/control/config").json()
    assert defaults == {"cache_blocks": 0, "block_tokens": 64, "prefill_seconds_per_token": 0.0,
                        "decode_seconds": 0.0, "knee": 0, "max_in_flight": 0, "slots": 0, "scheduling": "fcfs",
                        "preempt": False, "metrics_dialect": "vllm"}
    for bad in ({"cache_block": 3}, {"knee": -1}, {"knee": 1.5}, {"block_tokens": 0}, {"decode_seconds": "1"},
                {"slots": True}, {"scheduling": "lifo"}, {"preempt": 1}, {"metrics_dialect": "vllm2"}):
        r = client.post("/control/config", json=bad)
        assert r.status_code == 400, bad
    assert client.post("/control/config", json={"cache_blocks": 8, "knee": 4}).json() == {
        **defaults, "cache_blocks": 8, "knee": 4}
    assert cached(client, "a " * 130) == 0
    client.post("/control/reset").raise_for_status()
    assert client.get("/control/config").json() == defaults
    assert "prompt_tokens_details" not in complete(client, "a " * 130)  # no cache: no cached_tokens reported


def test_command_line_settings_are_what_reset_comes_back_to() -> None:
    with running_test_engine("--cache-blocks", "8", "--block-tokens", "2", "--max-in-flight", "5") as base_url:
        control = EngineControl(base_url)
        assert control.config(knee=3)["knee"] == 3
        with httpx.Client(base_url=control.root, timeout=10) as c:
            assert [cached(c, "a b c d e") for _ in range(2)] == [0, 4]
            control.reset()
            assert c.get("/control/config").json() == {
                "cache_blocks": 8, "block_tokens": 2, "prefill_seconds_per_token": 0.0, "decode_seconds": 0.0,
                "knee": 0, "max_in_flight": 5, "slots": 0, "scheduling": "fcfs", "preempt": False,
                "metrics_dialect": "vllm"}
            assert cached(c, "a b c d e") == 0  # the reset emptied the cache too


def test_past_max_in_flight_the_engine_answers_429(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)
    control.config(max_in_flight=2)
    with ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(chat, client, "x #hold=full") for _ in range(2)]
        control.wait_held("full", 2)
        turned_away = chat(client, "one too many")
        assert turned_away.status_code == 429
        assert turned_away.json()["error"]["message"] == "test engine at capacity: 2 requests in flight"
        control.release("full")
        assert [call.result(timeout=10).status_code for call in calls] == [200, 200]
    assert chat(client, "room again").status_code == 200
    stats = control.stats()
    assert (stats["requests"], stats["too_many_requests"], stats["max_in_flight"]) == (4, 1, 2)


def test_service_time_shrinks_with_the_cached_prefix(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)
    control.config(cache_blocks=4, block_tokens=4, prefill_seconds_per_token=0.001, decode_seconds=0.002)
    assert cached(client, "a b c d e f g h i") == 0  # 9 tokens computed: 0.002 + 0.009 s
    assert cached(client, "a b c d e f g h i") == 8  # 1 token computed: 0.002 + 0.001 s
    assert control.stats()["service_seconds"] == pytest.approx(0.011 + 0.003)


def test_past_the_knee_every_request_takes_longer(client: httpx.Client, engine_url: str) -> None:
    """Four requests held, then let through one at a time: each starts with 4, 3, 2 and 1 in flight; with the knee
    at 2 the first two take (4/2)**2 and (3/2)**2 times as long as the last two."""
    control = EngineControl(engine_url)
    control.config(decode_seconds=0.001, knee=2)
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(chat, client, "x #hold=knee") for _ in range(4)]
        control.wait_held("knee", 4)
        pending = set(calls)
        for _ in range(4):
            control.release("knee", count=1)
            done, pending = wait(pending, timeout=10, return_when=FIRST_COMPLETED)  # it answers before the next goes
            assert len(done) == 1
        assert [call.result(timeout=10).status_code for call in calls] == [200] * 4
    assert control.stats()["service_seconds"] == pytest.approx(0.001 * (4 + 2.25 + 1 + 1))


# -- the scheduler of a real engine: slots, a waiting queue, priority order, preemption, /metrics --------------


def ask(client: httpx.Client, text: str, priority: int | None = None, model: str = "m") -> httpx.Response:
    body: dict = {"model": model, "messages": [{"role": "user", "content": text}]}
    if priority is not None:
        body["priority"] = priority
    return client.post("/v1/chat/completions", json=body)


def next_at_a_gate(control: EngineControl, names: list[str]) -> str:
    """The one of ``names`` whose gate a request has reached (with one slot, one at a time)."""
    deadline = time.monotonic() + 60
    while not (reached := [n for n, g in control.gates().items() if n in names and g["waiting"]]):
        assert time.monotonic() < deadline, control.gates()
        time.sleep(0.02)
    assert len(reached) == 1, control.gates()
    return reached[0]


def test_slots_serve_so_many_at_once_and_queue_the_rest(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)
    control.config(slots=2, max_in_flight=4)
    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(ask, client, "x #hold=run") for _ in range(2)]
        control.wait_held("run", 2)
        queued = [pool.submit(ask, client, "y #hold=queue") for _ in range(2)]
        stats = control.wait_stats(running=2, waiting=2)
        assert (stats["in_flight"], stats["max_waiting"]) == (4, 2)
        assert control.held("queue") == 0  # waiting for a slot, not yet at their gate
        assert ask(client, "one too many").status_code == 429  # the waiting count as in flight
        control.release("run", count=1)
        assert running[0].result(timeout=10).status_code == 200 or running[1].result(timeout=10).status_code == 200
        control.wait_held("queue", 1)  # the first answer gave its slot to the first in the queue
        assert control.wait_stats(running=2, waiting=1)["max_waiting"] == 2
        control.release()
        assert [call.result(timeout=10).status_code for call in running + queued] == [200] * 4
    assert control.wait_stats(running=0, waiting=0)["preemptions"] == 0


@pytest.mark.parametrize(("scheduling", "order"), [
    ("fcfs", ["p5", "p1", "p5b", "p0"]),
    ("priority", ["p0", "p1", "p5", "p5b"]),  # lower value first, arrival order within a value
])
def test_the_queue_is_served_in_arrival_or_priority_order(
    client: httpx.Client, engine_url: str, scheduling: str, order: list[str]
) -> None:
    control = EngineControl(engine_url)
    control.config(slots=1, scheduling=scheduling)
    queued = [("p5", 5), ("p1", 1), ("p5b", 5), ("p0", None)]  # no priority field: 0
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(ask, client, "x #hold=first", 9)
        control.wait_held("first", 1)
        calls = []
        for waiting, (name, priority) in enumerate(queued, start=1):
            calls.append(pool.submit(ask, client, f"x #hold={name}", priority))
            control.wait_stats(waiting=waiting)  # one at a time: their arrival order is the list's
        control.release("first")
        served = []
        for _ in queued:
            served.append(next_at_a_gate(control, [name for name, _ in queued if name not in served]))
            control.release(served[-1])
        assert served == order
        assert [call.result(timeout=10).status_code for call in [first, *calls]] == [200] * 5


def test_a_lower_value_preempts_the_running_request_with_the_highest(client: httpx.Client, engine_url: str) -> None:
    """Batch requests at 10 and 5 fill both slots; a chat request at 0 takes the slot of the one at 10, which waits
    and starts over once the chat request is done; another at 5 finds no higher value running and waits."""
    control = EngineControl(engine_url)
    control.config(slots=2, scheduling="priority", preempt=True)
    with ThreadPoolExecutor(4) as pool:
        ten = pool.submit(ask, client, "ten #hold=ten", 10)
        control.wait_held("ten", 1)
        five = pool.submit(ask, client, "five #hold=five", 5)
        control.wait_held("five", 1)
        chat_ = pool.submit(ask, client, "chat #hold=chat", 0)
        control.wait_held("chat", 1)
        assert (control.held("ten"), control.held("five")) == (0, 1)  # the one at 10 lost its slot
        stats = control.wait_stats(running=2, waiting=1)
        assert stats["preemptions"] == 1
        other = pool.submit(ask, client, "other five #hold=other", 5)
        control.wait_stats(running=2, waiting=2)  # 5 is not lower than the 5 running: no preemption
        control.release("chat")
        assert chat_.result(timeout=10).status_code == 200
        assert next_at_a_gate(control, ["ten", "other"]) == "other"  # the freed slot goes to the lower value
        control.release("other")
        control.wait_held("ten", 1)  # ... then to the preempted request, which starts over
        control.release()
        answers = [call.result(timeout=10) for call in (ten, five, other)]
        assert [a.json()["choices"][0]["message"]["content"] for a in answers] == [
            "echo: ten #hold=ten", "echo: five #hold=five", "echo: other five #hold=other"]
    stats = control.wait_stats(running=0, waiting=0)
    assert (stats["requests"], stats["preemptions"], stats["max_waiting"]) == (4, 1, 2)
    assert control.gates()["ten"]["passed"] == 1  # served once, after its restart


def metric_values(text: str) -> dict[str, float]:
    """``{name: value}`` of every sample, parsed as Prometheus does."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize(("dialect", "names", "labels"), [
    ("vllm", ("vllm:num_requests_running", "vllm:num_requests_waiting"), {"model_name": "chat-model"}),
    ("sglang", ("sglang:num_running_reqs", "sglang:num_queue_reqs"), {"model_name": "chat-model"}),
    ("llama.cpp", ("llamacpp:requests_processing", "llamacpp:requests_deferred"), {}),
])
def test_metrics_tell_running_and_waiting_in_each_engines_names(
    client: httpx.Client, engine_url: str, dialect: str, names: tuple[str, str], labels: dict
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    control = EngineControl(engine_url)
    control.config(slots=2, metrics_dialect=dialect)
    assert metric_values(control.metrics().text) == {**dict.fromkeys(names, 0.0),
                                                     **({"vllm:kv_cache_usage_perc": 0.0} if dialect == "vllm" else {})}
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(ask, client, "x #hold=metrics", model="chat-model") for _ in range(3)]
        control.wait_stats(running=2, waiting=1)
        answer = control.metrics()
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
        values = metric_values(answer.text)
        assert (values[names[0]], values[names[1]]) == (2.0, 1.0)
        if dialect == "vllm":
            assert values["vllm:kv_cache_usage_perc"] == 1.0  # both slots taken
        samples = [s for f in text_string_to_metric_families(answer.text) for s in f.samples]
        assert all(s.labels == labels for s in samples)
        control.release("metrics")
        assert [call.result(timeout=10).status_code for call in calls] == [200] * 3


def test_broken_metrics_for_tests_and_reset_restores_them(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)
    control.config(metrics_dialect="garbage")
    garbage = control.metrics()
    assert garbage.status_code == 200
    with pytest.raises(ValueError):
        metric_values(garbage.text)
    control.config(metrics_dialect="missing")
    values = metric_values(control.metrics().text)  # valid text ...
    assert values and not any(name.startswith(("vllm:", "sglang:", "llamacpp:")) for name in values)  # ... no names
    control.config(metrics_dialect="500")
    assert control.metrics().status_code == 500
    control.reset()
    assert "vllm:num_requests_waiting" in metric_values(control.metrics().text)


def test_scheduler_flags_are_what_reset_comes_back_to() -> None:
    flags = ("--slots", "1", "--scheduling", "priority", "--preempt", "--metrics-dialect", "llama.cpp")
    with running_test_engine(*flags) as base_url:
        control = EngineControl(base_url)
        control.config(slots=3, preempt=False)
        control.reset()
        config = control.config()
        assert {k: config[k] for k in ("slots", "scheduling", "preempt", "metrics_dialect")} == {
            "slots": 1, "scheduling": "priority", "preempt": True, "metrics_dialect": "llama.cpp"}
        assert "llamacpp:requests_deferred" in metric_values(control.metrics().text)


def test_reset_lets_the_waiting_requests_go(client: httpx.Client, engine_url: str) -> None:
    control = EngineControl(engine_url)
    control.config(slots=1)
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(ask, client, "x #hold=stuck") for _ in range(3)]
        control.wait_stats(running=1, waiting=2)
        control.reset()
        assert [call.result(timeout=10).status_code for call in calls] == [200] * 3
