"""Sharing an engine with interactive traffic (docs/engines.md): a batch sent at the engine's low priority
(``engine_priority``), stepping aside while others' requests wait on the engine (``load_metrics``,
``yield_to_interactive``), and running on as before when the engine's metrics fail or lie. Through `orl serve` and
separate `orl worker` processes against the test engine, with others' requests sent straight to it."""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.support import http_client
from tests.support.batches import chat, create, get, results, wait_for
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


def test_a_batch_sends_nothing_while_others_wait_and_takes_the_engine_back(make_server, start_worker, engine,
                                                                           engine_url, interactive):
    engine.config(slots=1, metrics_dialect="vllm")
    server = make_server(catalog=sharing_catalog(engine_url, 'load_metrics = "vllm"'), args=("--no-worker",))
    start_worker(server)
    first = interactive.send("a person's question #hold=chat")  # runs in the engine's one slot until released
    engine.wait_held("chat")
    second = interactive.send("another person's question")  # waits for the slot
    engine.wait_stats(running=1, waiting=1)
    batch_id = create(server, [chat(f"r{i}", f"record {i}") for i in range(4)])["id"]
    wait_for(lambda: get(server, batch_id)["openrelay"]["yielding"], "the batch to yield")
    assert get(server, batch_id)["openrelay"]["concurrency_limit"] == 0
    assert batch_texts(engine) == []  # nothing of the batch went to the engine while a person's request waited
    engine.release("chat")
    assert first.result() == second.result() == 200
    batch = server.wait(batch_id)  # the people gone, the batch takes the engine back
    assert batch["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert sorted(batch_texts(engine)) == [f"record {i}" for i in range(4)]  # each sent once


def test_records_waiting_for_room_are_left_unsent_by_a_cancel(make_server, engine, engine_url, interactive):
    engine.config(slots=1)
    server = make_server(catalog=sharing_catalog(engine_url, 'load_metrics = "vllm"'))
    interactive.send("a person's question #hold=chat")
    engine.wait_held("chat")
    interactive.send("another person's question")
    engine.wait_stats(running=1, waiting=1)
    batch_id = create(server, [chat(f"r{i}", f"record {i}") for i in range(3)])["id"]
    wait_for(lambda: get(server, batch_id)["openrelay"]["yielding"], "the batch to yield")
    assert server.http("POST", f"/batches/{batch_id}/cancel").status_code == 200
    batch = server.wait(batch_id)
    assert batch["status"] == "cancelled"
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    out, err = results(server, batch)
    assert out == {} and {line["error"]["code"] for line in err.values()} == {"batch_cancelled"}
    assert all("before this request started" in line["error"]["message"] for line in err.values()), err
    assert batch_texts(engine) == []
    engine.release("chat")


def test_the_engines_load_and_the_yielding_are_on_metrics(make_server, engine, engine_url, interactive):
    engine.config(slots=1, metrics_dialect="sglang")
    server = make_server(catalog=sharing_catalog(engine_url, 'load_metrics = "sglang"'))
    batch_id = create(server, [chat("r0", "record 0 #hold=batch"), chat("r1", "record 1")])["id"]
    engine.wait_stats(running=1, waiting=1)

    def load() -> tuple:
        return tuple(metric(server, "openrelay_engine_load_requests", state=state)
                     for state in ("running", "waiting", "ours")) + (metric(server, "openrelay_engine_yielding"),)

    # The batch's first record holds the one slot: only its own load, no reason to yield. Its second record
    # queues behind it on the engine, its own again, no one else's.
    wait_for(lambda: load() == (1, 1, 2, 0), "our own load read", every=0.1)
    person = interactive.send("a person's question")
    wait_for(lambda: load() == (1, 2, 2, 1), "a person's request waiting beside ours", every=0.1)
    assert metric(server, "openrelay_engine_load_metrics_up") == 1
    engine.release("batch")
    assert person.result() == 200
    assert server.wait(batch_id)["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


@pytest.mark.parametrize("broken", ["garbage", "missing", "500", "unreachable"])
def test_a_broken_metrics_endpoint_never_stops_a_batch(make_server, engine, engine_url, broken):
    knobs = 'load_metrics = "vllm"'
    if broken == "unreachable":
        knobs += ', metrics_url = "http://127.0.0.1:9/metrics"'  # nothing listens there
    else:
        engine.config(metrics_dialect=broken)
    server = make_server(catalog=sharing_catalog(engine_url, knobs))
    batch_id = create(server, [chat(f"r{i}", f"record {i} #hold=batch") for i in range(3)])["id"]
    engine.wait_held("batch", 2)  # sent as without load metrics: the model's concurrency of 2
    assert metric(server, "openrelay_engine_load_metrics_up") == 0
    engine.release("batch")
    batch = server.wait(batch_id)
    assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert server.log().count("its load metrics at") == 1  # said once, however many reads failed


def test_a_record_the_engine_preempts_is_one_record_billed_once(make_server, start_worker, engine, engine_url,
                                                               interactive):
    engine.config(slots=1, scheduling="priority", preempt=True)
    server = make_server(catalog=sharing_catalog(engine_url, "engine_priority = 10", concurrency=1),
                         args=("--no-worker",))
    start_worker(server)
    batch_id = create(server, [chat("r", "summarise this long document #hold=batch")])["id"]
    engine.wait_held("batch")
    # A person's request at the default priority 0 takes the slot from the batch's (10), which waits again and
    # starts over: the person is answered while the batch's record is still held.
    assert interactive.send("a person's question").result() == 200
    assert engine.stats()["preemptions"] == 1
    engine.release("batch")
    batch = server.wait(batch_id)
    assert batch["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert batch_texts(engine) == ["summarise this long document #hold=batch"]  # one call: no retry, no double
    out, err = results(server, batch)
    assert err == {} and list(out) == ["r"]
    assert batch["usage"]["input_tokens"] == out["r"]["response"]["body"]["usage"]["prompt_tokens"]  # billed once
