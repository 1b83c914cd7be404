"""The worker sends a batch's records in its stored dispatch order: records that share a prompt prefix back to
back, largest groups first; ``prefix_grouping = false`` keeps input order. With ``base_urls`` every prefix group
goes to one replica, and losing a replica mid-batch costs no record."""

from __future__ import annotations

import random
import re
from typing import Any

from tests.support import http_client
from tests.support.batches import create, create_from_file, get, results, wait_for
from tests.support.server import catalog_text
from tests.support.test_engine import EngineControl, running_test_engine, start_test_engine, stop_test_engine

# Long enough that the shared part spans several of the create's prefix blocks.
SYSTEM = "You answer questions about the document below, briefly and exactly. " * 12


def document(n: int) -> str:
    return f"Document {n}: " + " ".join(f"fact-{n}-{i} is {i * n}" for i in range(90))


def grouped_records(sizes: list[int], seed: int = 7, hold: str | None = None) -> list[dict[str, Any]]:
    """Records of ``len(sizes)`` documents, ``sizes[d]`` questions each, shuffled."""
    records = []
    for d, size in enumerate(sizes):
        for q in range(size):
            question = f"Question {q} about document {d}?" + (f" #hold={hold}" if hold else "")
            records.append({"custom_id": f"d{d}-q{q}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "test/echo", "max_tokens": 8, "messages": [
                                {"role": "system", "content": SYSTEM},
                                {"role": "user", "content": document(d) + "\n\n" + question}]}})
    random.Random(seed).shuffle(records)
    return records


def asked_text(request: dict[str, Any]) -> str:
    """The last user message of a request the test engine recorded."""
    return request["body"]["messages"][-1]["content"]


def document_of(request: dict[str, Any]) -> int:
    return int(re.match(r"Document (\d+):", asked_text(request)).group(1))


def runs(sequence: list[int]) -> list[tuple[int, int]]:
    """(value, length) of each run of equal neighbours."""
    found: list[tuple[int, int]] = []
    for value in sequence:
        if found and found[-1][0] == value:
            found[-1] = (value, found[-1][1] + 1)
        else:
            found.append((value, 1))
    return found


def test_shared_prefixes_go_out_back_to_back_largest_group_first(make_server, engine):
    server = make_server(slots=1, concurrency=1)
    sizes = [3, 7, 5, 2]
    batch = server.wait(create_from_file(server, grouped_records(sizes))["id"])
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == sum(sizes)
    order = [document_of(r) for r in engine.requests()]
    assert runs(order) == [(1, 7), (2, 5), (0, 3), (3, 2)]
    assert not (server.data_dir / "blobs" / "batches" / batch["id"] / "dispatch.bin").exists()  # ended: order gone


def test_inline_requests_are_grouped_too(make_server, engine):
    server = make_server(slots=1, concurrency=1)
    batch = server.wait(create(server, grouped_records([2, 4]))["id"])
    assert batch["status"] == "completed"
    assert runs([document_of(r) for r in engine.requests()]) == [(1, 4), (0, 2)]


def _asked(doc: int, question: str) -> dict[str, Any]:
    return {"custom_id": question.split()[0], "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "test/echo", "max_tokens": 8, "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": document(doc) + "\n\n" + question}]}}


def test_a_batch_starts_with_the_group_another_batch_of_its_model_is_sending(make_server, engine):
    server = make_server(slots=2, concurrency=1)
    first = create(server, [_asked(5, f"x{q} asks #hold=x") for q in range(6)])["id"]
    engine.wait_held("x", 1)  # the first batch is sending document 5
    # Alone, the second batch would start with its largest group (document 6); document 5 is hot.
    second = [_asked(6, f"y{q} asks") for q in range(5)] + [_asked(5, f"y{q} asks") for q in range(5, 7)]
    second_id = create(server, second)["id"]
    assert server.wait(second_id)["status"] == "completed"
    of_second = [document_of(r) for r in engine.requests() if "\n\ny" in asked_text(r)]
    assert of_second == [5, 5, 6, 6, 6, 6, 6]
    engine.release("x")
    assert server.wait(first)["status"] == "completed"


def test_prefix_grouping_false_keeps_input_order(make_server, engine, engine_url):
    catalog = catalog_text(engine_url, slots=1, concurrency=1, echo="prefix_grouping = false")
    server = make_server(catalog=catalog)
    records = grouped_records([3, 4, 2])
    batch = server.wait(create_from_file(server, records)["id"])
    assert batch["status"] == "completed"
    sent = [asked_text(r) for r in engine.requests()]
    assert sent == [r["body"]["messages"][-1]["content"] for r in records]


def _replica_catalog(urls: list[str], concurrency: int) -> str:
    return catalog_text(urls[0], slots=1, concurrency=concurrency, engine_urls=urls)


def test_each_prefix_group_goes_to_one_replica_and_both_are_used(make_server):
    with running_test_engine() as a_url, running_test_engine() as b_url:
        server = make_server(catalog=_replica_catalog([a_url, b_url], concurrency=1))
        sizes = [3] * 16
        batch = server.wait(create_from_file(server, grouped_records(sizes))["id"])
        assert batch["status"] == "completed" and batch["request_counts"]["completed"] == sum(sizes)
        seen = {url: {document_of(r) for r in EngineControl(url).requests()} for url in (a_url, b_url)}
        assert seen[a_url] and seen[b_url], seen  # 16 groups on one replica of two: 1 chance in 32,768
        assert not seen[a_url] & seen[b_url], seen  # no group was split between them
        assert len(EngineControl(a_url).requests()) + len(EngineControl(b_url).requests()) == sum(sizes)


def test_a_replica_killed_mid_batch_costs_no_record(make_server):
    proc_a, a_url = start_test_engine()
    try:
        with running_test_engine() as b_url:
            a, b = EngineControl(a_url), EngineControl(b_url)
            server = make_server(catalog=_replica_catalog([a_url, b_url], concurrency=4))
            total = 24
            records = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "test/echo", "messages": [
                            {"role": "user", "content": f"unique question {i} #hold=h"}]}} for i in range(total)]
            batch_id = create(server, records)["id"]
            a.wait_held("h", 1)
            b.wait_held("h", 1)  # ungrouped records spread over both replicas
            proc_a.kill()  # kill -9: the requests held there get no answer
            proc_a.wait()
            b.release("h")
            batch = server.wait(batch_id, timeout=120)
            assert batch["status"] == "completed", batch
            assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
            out, err = results(server, batch)
            assert sorted(out) == sorted(f"r{i}" for i in range(total)) and err == {}
            metrics = http_client.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
            assert f'openrelay_engine_up{{model="test/echo",replica="{a_url}"}} 0.0' in metrics
            assert f'openrelay_engine_up{{model="test/echo",replica="{b_url}"}} 1.0' in metrics
    finally:
        stop_test_engine(proc_a)


def test_progress_shows_the_concurrency_limit(make_server, engine):
    server = make_server(slots=1, concurrency=3)
    batch_id = create(server, grouped_records([2], hold="p"))["id"]
    engine.wait_held("p", 1)
    shown = wait_for(lambda: get(server, batch_id)["openrelay"].get("concurrency_limit"), "the limit shown")
    assert shown == 3
    engine.release("p")
    assert server.wait(batch_id)["status"] == "completed"
