"""``concurrency = "auto"``: one limiter per engine replica, shared by the model's running batches; a 429 or 503 is
the engine asking for less, never a record's failure; the limit is on /metrics and in the progress object; what a
limiter learnt is kept in the store, and a worker started later begins there."""

from __future__ import annotations

import re

from openrelay.store.db import Database
from openrelay.store.engine_limits import EngineLimits, Learnt
from tests.conftest import BACKEND
from tests.support import http_client
from tests.support.batches import chat, create, get, results, wait_for
from tests.support.server import TEST_CATALOG, create_pg_database, drop_pg_database


def auto_catalog(engine_url: str, *, low: int = 1, high: int = 16) -> str:
    return TEST_CATALOG.format(engine=engine_url, slots=2, concurrency=f'"auto"\nmin_concurrency = {low}\n'
                                                                      f"max_concurrency = {high}")


def limit_metric(server) -> float | None:
    text = http_client.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
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


def test_a_restarted_worker_starts_from_the_limit_learnt_before(make_server, engine, engine_url):
    server = make_server(catalog=auto_catalog(engine_url))
    first = create(server, [chat(f"a{i}", f"learning {i}") for i in range(20)])["id"]
    assert server.wait(first)["request_counts"]["completed"] == 20  # windows answered: a baseline latency
    engine.mode(status=429)  # the engine pushes back: the limit it backs off to is one to keep
    second = create(server, [chat(f"b{i}", f"pushed back {i}") for i in range(3)])["id"]
    wait_for(lambda: engine.stats()["requests"] >= 3 + 20, "the 429s")
    engine.mode(status=None)
    assert server.wait(second)["request_counts"]["completed"] == 3
    server.stop()  # a clean stop keeps what its limiters learnt
    limits = EngineLimits(Database(server.database_url))
    kept = limits.learnt("test/echo")
    assert list(kept) == [engine_url] and 1 <= kept[engine_url].limit <= 16 and kept[engine_url].baseline_seconds > 0
    limits.save("test/echo", {engine_url: Learnt(7, kept[engine_url].baseline_seconds)})  # a limit to recognise
    limits.db.dispose()

    server.start()  # a fresh worker: its limiter starts at 7, not at min_concurrency (1)
    held = create(server, [chat(f"h{i}", f"held {i} #hold=r") for i in range(20)])["id"]
    engine.wait_held("r", 7)
    assert limit_metric(server) == 7 and engine.held("r") == 7
    engine.release("r")
    assert server.wait(held)["request_counts"] == {"total": 20, "completed": 20, "failed": 0}


def test_learnt_limits_are_kept_per_model_and_replica(tmp_path):
    url = create_pg_database() if BACKEND == "postgres" else f"sqlite:///{tmp_path / 'limits.db'}"
    db = Database(url)
    try:
        db.migrate()
        limits = EngineLimits(db)
        assert limits.learnt("m") == {}
        limits.save("m", {"http://a/v1": Learnt(12, 0.5), "http://b/v1": Learnt(3, 0.25)})
        limits.save("other", {"http://a/v1": Learnt(40, 0.1)})
        limits.save("m", {"http://a/v1": Learnt(9, 0.75)})  # the last write wins, replica by replica
        assert limits.learnt("m") == {"http://a/v1": Learnt(9, 0.75), "http://b/v1": Learnt(3, 0.25)}
        assert limits.learnt("other") == {"http://a/v1": Learnt(40, 0.1)}
    finally:
        db.dispose()
        if BACKEND == "postgres":
            drop_pg_database(url)
