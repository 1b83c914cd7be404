"""``concurrency = "auto"``: one limiter per engine replica, shared by the model's running batches; a 429 or 503 is
the engine asking for less, never a record's failure; the limit is on /metrics and in the progress object."""

from __future__ import annotations

import re

import httpx

from tests.support.batches import chat, create, get, results, wait_for
from tests.support.server import TEST_CATALOG


def auto_catalog(engine_url: str, *, low: int = 1, high: int = 16) -> str:
    return TEST_CATALOG.format(engine=engine_url, slots=2, concurrency=f'"auto"\nmin_concurrency = {low}\n'
                                                                      f"max_concurrency = {high}")


def limit_metric(server) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    found = re.search(r'^openrelay_engine_concurrency_limit\{model="test/echo",replica="[^"]*"\} (\S+)$', text,
                      re.MULTILINE)
    return float(found.group(1)) if found else None


def test_429_and_503_never_fail_a_record_under_auto(make_server, engine, engine_url):
    # Two attempts would fail a record with a fixed concurrency (test_execution.py shows it); here the engine's
    # pushback is retried without using attempts up.
    server = make_server(catalog=auto_catalog(engine_url),
                         env={"OPENRELAY_RETRY_ATTEMPTS": "2", "OPENRELAY_RETRY_MAX_SECONDS": "0.05"})
    for status in (429, 503):
        engine.reset()
        engine.mode(status=status)
        batch_id = create(server, [chat(f"t{i}", f"pushed back {status} {i}") for i in range(3)])["id"]
        wait_for(lambda: engine.stats()["requests"] >= 12, f"records to be sent again after {status}s")
        assert get(server, batch_id)["request_counts"]["failed"] == 0
        engine.mode(status=None)
        batch = server.wait(batch_id)
        assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}, batch
        out, err = results(server, batch)
        assert sorted(out) == ["t0", "t1", "t2"] and err == {}


def test_the_limit_is_on_metrics_and_in_the_progress_object(make_server, engine, engine_url):
    server = make_server(catalog=auto_catalog(engine_url, low=2, high=12))
    batch_id = create(server, [chat(f"h{i}", f"held {i} #hold=a") for i in range(20)])["id"]
    engine.wait_held("a", 2)
    shown = wait_for(lambda: get(server, batch_id)["openrelay"].get("concurrency_limit"), "the limit shown")
    assert 2 <= shown <= 12
    assert 2 <= limit_metric(server) <= 12
    assert engine.held("a") <= 12  # never more in flight than max_concurrency
    engine.release("a")
    batch = server.wait(batch_id)
    assert batch["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    assert engine.stats()["max_in_flight"] <= 12
