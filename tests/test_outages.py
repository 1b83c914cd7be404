"""Engine outages pause a model's dispatch instead of burning its records; the batch resumes by itself."""

from __future__ import annotations

import re

from tests.support import http_client
from tests.support.batches import chat, create, get, prompt_text, results, usage_of, wait_for
from tests.support.server import TEST_CATALOG, free_port
from tests.support.test_engine import EngineControl, start_test_engine, stop_test_engine

# Short retries and outage probes so an outage of a few seconds is many probes long.
FAST = {"OPENRELAY_RETRY_ATTEMPTS": "3", "OPENRELAY_OUTAGE_BASE_SECONDS": "0.2", "OPENRELAY_OUTAGE_MAX_SECONDS": "0.5"}


def _metric(server, name: str, model: str = "test/echo") -> float | None:
    text = http_client.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    found = re.search(rf'^{name}{{model="{re.escape(model)}"[^}}]*}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_engine_process_stopped_mid_batch_and_restarted_loses_no_record(make_server, tmp_path):
    port = free_port()
    proc, url = start_test_engine("--port", str(port))
    catalog = TEST_CATALOG.format(engine=url, slots=1, concurrency=4)
    server = make_server(catalog=catalog, env=FAST)
    total = 40
    batch_id = create(server, [chat(f"o{i}", f"ride out the outage {i} #hold=o") for i in range(total)])["id"]
    try:
        control = EngineControl(url)
        control.wait_held("o", 4)
        control.release("o", count=4)  # four finish; the next four are in flight when the engine stops
        wait_for(lambda: get(server, batch_id)["request_counts"]["completed"] == 4, "some records to finish")
        control.wait_held("o", 4)
        stop_test_engine(proc)  # the engine is gone: connections are refused from now on
        wait_for(lambda: _metric(server, "openrelay_engine_up") == 0, "the model's dispatch to pause")
        paused = get(server, batch_id)
        assert paused["status"] == "in_progress" and paused["request_counts"]["failed"] == 0
        proc, _ = start_test_engine("--port", str(port))  # back on the same address
        control.release("o")  # the new engine lets every record through
        batch = server.wait(batch_id, timeout=120)
    finally:
        stop_test_engine(proc)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
    out, err = results(server, batch)
    assert sorted(out) == sorted(f"o{i}" for i in range(total)) and err == {}
    assert batch["usage"] == usage_of(out)
    assert _metric(server, "openrelay_engine_up") == 1
    assert "looks down" in server.log() and "answers again" in server.log()


def test_engine_answering_5xx_to_everything_pauses_until_it_recovers(make_server, engine):
    server = make_server(concurrency=4, env=FAST)
    engine.mode(status=503)
    total = 12
    batch_id = create(server, [chat(f"f{i}", f"wait for the fleet {i}") for i in range(total)])["id"]
    wait_for(lambda: _metric(server, "openrelay_engine_up") == 0, "the model's dispatch to pause")
    # Several probe rounds pass while every call fails; no record is given up on.
    wait_for(lambda: len(engine.requests()) >= 3 * total, "many failed attempts")
    assert get(server, batch_id)["request_counts"] == {"total": total, "completed": 0, "failed": 0}
    engine.mode(status=None)
    batch = server.wait(batch_id, timeout=120)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
    out, err = results(server, batch)
    assert len(out) == total and err == {}


def test_one_broken_record_fails_without_pausing_the_model(make_server, engine):
    server = make_server(concurrency=2, env=FAST)
    records = [chat("broken", "always broken #status=500")] + [chat(f"g{i}", f"fine {i} #sleep=0.1")
                                                               for i in range(10)]
    batch = server.wait(create(server, records)["id"])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 11, "completed": 10, "failed": 1}
    out, err = results(server, batch)
    assert err["broken"]["error"]["status_code"] == 500
    assert sum(prompt_text(r) == "always broken #status=500" for r in engine.requests()) == 3
    assert "looks down" not in server.log()


def test_engine_down_for_the_whole_window_expires_the_batch_without_failing_records(make_server):
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    catalog = TEST_CATALOG.format(engine=closed, slots=1, concurrency=2)
    server = make_server(catalog=catalog, env=FAST, args=("--window-seconds", "3"))
    batch = server.wait(create(server, [chat(f"d{i}", f"nobody home {i}") for i in range(3)])["id"])
    assert batch["status"] == "expired"
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert batch["output_file_id"] is None and batch["error_file_id"] == f"file-{batch['id']}-error"
    assert batch["usage"]["total_tokens"] == 0 and batch["usage"]["cost_nano_usd"] == 0
    out, err = results(server, batch)
    assert out == {} and sorted(err) == ["d0", "d1", "d2"]
    assert {line["error"]["code"] for line in err.values()} == {"batch_expired"}


def test_metrics_show_queued_and_in_flight_per_model(make_server, engine):
    server = make_server(slots=1, concurrency=3)
    running = create(server, [chat(f"r{i}", f"hold on {i} #hold=r") for i in range(3)])["id"]
    queued = create(server, [chat("q0", "after you")])["id"]
    wait_for(lambda: _metric(server, "openrelay_engine_requests_in_flight") == 3, "three requests in flight")
    wait_for(lambda: _metric(server, "openrelay_batches_queued") == 1, "the second batch queued")
    assert _metric(server, "openrelay_batches_in_progress") == 1
    engine.release("r")
    for batch_id in (running, queued):
        assert server.wait(batch_id)["status"] == "completed"
    assert _metric(server, "openrelay_engine_requests_in_flight") == 0
    assert _metric(server, "openrelay_batches_queued") is None


def test_engine_that_passes_probes_but_fails_every_call_is_waited_for_only_so_long(make_server, engine):
    server = make_server(concurrency=2, env={**FAST, "OPENRELAY_SICK_ENGINE_SECONDS": "2"})
    engine.mode(status=500)
    batch = server.wait(create(server, [chat(f"s{i}", f"never served {i}") for i in range(4)])["id"])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 4, "completed": 0, "failed": 4}
    out, err = results(server, batch)
    assert out == {} and {line["error"]["status_code"] for line in err.values()} == {500}
    assert "fails every call" in server.log()
    # More than the attempts alone: the records waited through pauses before giving up.
    assert len(engine.requests()) > 4 * 3
