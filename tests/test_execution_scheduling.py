"""Running batches end to end over HTTP: queueing, slots, priority, concurrency, big batches, expiry, crashes."""

from __future__ import annotations

import time

import orjson

from openrelay.store.db import Database
from openrelay.store.schema import batches
from tests.support.batches import (
    TERMINAL,
    batch_usage,
    chat,
    create,
    create_from_file,
    get,
    prompt_text,
    results,
    usage_of,
    wait_for,
)


def _first_request(engine, marker: str) -> int:
    """Position of the first request the engine received whose text starts with ``marker``."""
    texts = [prompt_text(r) for r in engine.requests()]
    return next(i for i, text in enumerate(texts) if text.startswith(marker))


def test_concurrency_caps_requests_in_flight(make_server, engine):
    server = make_server(concurrency=3)
    batch_id = create(server, [chat(f"c{i}", f"parallel {i} #hold=c") for i in range(9)])["id"]
    engine.wait_held("c", 3)  # three at once, held; max_in_flight below shows there were never more
    engine.release("c")
    batch = server.wait(batch_id)
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 9
    stats = engine.stats()
    assert stats["requests"] == 9
    assert stats["max_in_flight"] == 3


def test_slots_queue_a_second_batch_until_the_first_finishes(make_server, engine):
    server = make_server(slots=1, concurrency=2)
    first = create(server, [chat(f"a{i}", f"first batch {i} #hold=first") for i in range(12)])
    assert first["in_progress_at"] is None
    running = wait_for(lambda: (b := get(server, first["id"]))["in_progress_at"] is not None and b,
                       "the first batch to start")
    assert running["status"] == "in_progress"
    second = create(server, [chat(f"b{i}", f"second batch {i}") for i in range(3)])

    # The second batch joins the queue: in_progress, but not started while the first holds the only slot.
    queued = wait_for(lambda: (b := get(server, second["id"]))["status"] != "validating" and b,
                      "the second batch to be queued")
    assert queued["status"] == "in_progress" and queued["in_progress_at"] is None
    assert queued["request_counts"]["completed"] == 0 and queued["usage"]["cost_nano_usd"] == 0
    assert get(server, first["id"])["status"] not in TERMINAL  # so that was observed while the first ran
    assert not any(prompt_text(r).startswith("second batch") for r in engine.requests())

    engine.release("first")
    done_first = server.wait(first["id"])
    done_second = server.wait(second["id"])
    assert done_first["status"] == done_second["status"] == "completed"
    assert done_second["in_progress_at"] is not None
    assert done_second["in_progress_at"] >= done_first["in_progress_at"]
    texts = [prompt_text(r) for r in engine.requests()]
    last_first = max(i for i, t in enumerate(texts) if t.startswith("first batch"))
    assert _first_request(engine, "second batch") > last_first


def test_expedited_runs_before_older_standard(make_server, engine):
    server = make_server(slots=1, concurrency=2)
    long = create(server, [chat(f"l{i}", f"long batch {i} #hold=long") for i in range(12)])
    wait_for(lambda: get(server, long["id"])["in_progress_at"] is not None, "the long batch to start")
    standard = create(server, [chat(f"s{i}", f"standard batch {i}") for i in range(2)], priority="standard")
    client = server.client()
    expedited_file = client.files.create(
        file=("exp.jsonl", b"".join(
            orjson.dumps(chat(f"x{i}", f"expedited batch {i}")) + b"\n" for i in range(2))),
        purpose="batch")
    expedited = client.batches.create(input_file_id=expedited_file.id, endpoint="/v1/chat/completions",
                                      completion_window="24h", extra_body={"priority": "expedited"})
    assert standard["priority"] == "standard" and expedited.priority == "expedited"
    # Both were waiting behind the long batch, so the queue order decided which went first.
    assert get(server, standard["id"])["in_progress_at"] is None
    assert get(server, long["id"])["status"] not in TERMINAL

    engine.release("long")
    done = {b: server.wait(b) for b in (long["id"], standard["id"], expedited.id)}
    assert all(b["status"] == "completed" for b in done.values())
    assert _first_request(engine, "expedited batch") < _first_request(engine, "standard batch")
    assert done[expedited.id]["in_progress_at"] <= done[standard["id"]]["in_progress_at"]


def test_batch_larger_than_a_flush_completes_every_record_once(make_server, engine):
    server = make_server(concurrency=32, env={"OPENRELAY_FLUSH_RECORDS": "500"})
    total = 1200
    created = create_from_file(server, [chat(f"big-{i}", f"tiny {i}") for i in range(total)])
    assert created["request_counts"]["total"] == total
    batch = server.wait(created["id"], timeout=240)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
    assert batch["error_file_id"] is None
    out, err = results(server, batch)
    assert sorted(out) == sorted(f"big-{i}" for i in range(total)) and err == {}
    assert batch["usage"] == usage_of(out)
    assert engine.stats()["requests"] == total
    texts = [prompt_text(r) for r in engine.requests()]
    assert len(set(texts)) == total


def test_expired_batch_keeps_finished_records_and_bills_only_them(make_server, engine):
    server = make_server(concurrency=2, args=("--window-seconds", "3"))
    total = 30
    created = create(server, [chat(f"e{i}", f"too slow {i} #hold=e") for i in range(total)])
    assert created["expires_at"] == created["created_at"] + 3
    # Two records finish inside the window; the next two are in flight (held) when it closes.
    engine.wait_held("e", 2)
    engine.release("e", count=2)
    wait_for(lambda: get(server, created["id"])["request_counts"]["completed"] == 2, "two finished records")
    engine.wait_held("e", 2)
    wait_for(lambda: time.time() >= created["expires_at"], "the window to close", timeout=10)
    engine.release("e")
    batch = server.wait(created["id"])
    assert batch["status"] == "expired" and batch["expired_at"] is not None
    counts = batch["request_counts"]
    assert counts["total"] == total and counts["completed"] + counts["failed"] == total
    assert 0 < counts["completed"] < total
    assert batch["output_file_id"] == f"file-{batch['id']}-output"
    assert batch["error_file_id"] == f"file-{batch['id']}-error"
    out, err = results(server, batch)
    assert len(out) == counts["completed"] and len(err) == counts["failed"]
    assert set(out) | set(err) == {f"e{i}" for i in range(total)}
    for custom_id, line in err.items():
        assert line["id"] == f"batch_req_{custom_id}" and line["response"] is None
        assert line["error"]["code"] == "batch_expired" and line["error"]["message"]
    for line in out.values():
        assert line["response"]["status_code"] == 200 and line["error"] is None
    # Billed for what ran and nothing else; what never ran never reached the engine.
    assert batch["usage"] == usage_of(out)
    sent = {prompt_text(r) for r in engine.requests()}
    assert sent == {f"too slow {cid[1:]} #hold=e" for cid in out}



def test_batch_queued_past_its_window_expires_without_running(make_server, engine):
    server = make_server(slots=1, concurrency=2, args=("--window-seconds", "2"))
    # Holds the only slot past both windows: its first two records are still running when they close.
    holder = create(server, [chat(f"h{i}", f"hold the slot {i} #hold=h") for i in range(3)])
    engine.wait_held("h", 2)
    queued = create(server, [chat(f"q{i}", f"never started {i}") for i in range(3)])
    assert get(server, queued["id"])["in_progress_at"] is None

    never = server.wait(queued["id"])
    assert never["status"] == "expired" and never["in_progress_at"] is None
    assert never["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert never["usage"] == batch_usage()
    assert never["output_file_id"] is None and never["error_file_id"] == f"file-{never['id']}-error"
    out, err = results(server, never)
    assert out == {} and sorted(err) == ["q0", "q1", "q2"]
    assert {line["error"]["code"] for line in err.values()} == {"batch_expired"}
    assert not any(prompt_text(r).startswith("never started") for r in engine.requests())

    wait_for(lambda: time.time() >= holder["expires_at"], "the holder's window to close", timeout=10)
    engine.release("h")
    held = server.wait(holder["id"])
    assert held["status"] == "expired"
    assert held["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    out, err = results(server, held)
    assert len(out) == 2 and [line["error"]["code"] for line in err.values()] == ["batch_expired"]


def test_crash_loses_no_finished_record_and_reruns_only_in_flight_ones(make_server, engine):
    total, concurrency = 40, 4
    server = make_server(concurrency=concurrency)
    batch_id = create(server, [chat(f"k{i}", f"survive the crash {i} #hold=k") for i in range(total)])["id"]
    # Two rounds of four are let through; the third round is held in flight, so the crash lands at a known
    # point: eight finished (and durable), four in flight.
    for passed in (concurrency, 2 * concurrency):
        wait_for(lambda: engine.gates().get("k", {}).get("waiting") == concurrency, "a full round held")
        engine.release("k", count=concurrency)
        wait_for(lambda p=passed: engine.gates()["k"]["passed"] == p, "the round to be answered")
    engine.wait_held("k", concurrency)
    before = wait_for(lambda: (b := get(server, batch_id))["request_counts"]["completed"] == 2 * concurrency and b,
                      "the finished records to be durable")
    server.kill()
    hung = {prompt_text(r) for r in engine.requests()[2 * concurrency:]}
    assert len(hung) == concurrency
    assert before["request_counts"]["completed"] == 8
    engine.release("k")
    server.start()

    batch = server.wait(batch_id, timeout=120)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
    out, err = results(server, batch)
    assert sorted(out) == sorted(f"k{i}" for i in range(total)) and err == {}
    assert batch["usage"] == usage_of(out)  # nothing billed twice
    # Only the requests in flight at the crash ran again.
    wait_for(lambda: engine.stats()["in_flight"] == 0, "the hanging requests to end", timeout=30)
    texts = [prompt_text(r) for r in engine.requests()]
    assert total <= len(texts) <= total + concurrency
    assert {t for t in texts if texts.count(t) > 1} == hung


def test_worker_that_loses_its_lease_gives_the_batch_up_and_every_record_lands_once(make_server, engine,
                                                                                   start_worker):
    total, concurrency = 12, 4
    # Each answer is flushed at once, and the worker's heartbeat looks only every 60 s, first 60 s after its claim,
    # long after this test: the lane that flushes first after the takeover is what finds the lease gone. The batch
    # is queued before that worker starts, so the claim pass it makes on starting takes it.
    server = make_server(concurrency=concurrency, args=("--no-worker",), env={"OPENRELAY_FLUSH_RECORDS": "1"})
    # The first four go out together and are held: one is answered first, three later.
    holds = ["#hold=quick"] + ["#hold=slow"] * 3 + [""] * (total - concurrency)
    batch_id = create(server, [chat(f"l{i}", f"lease {i} {hold}") for i, hold in enumerate(holds)])["id"]
    worker = start_worker(server, "slow-heartbeat", env={"OPENRELAY_TICK_SECONDS": "60"})
    engine.wait_held("quick")
    engine.wait_held("slow", 3)
    assert worker.took(batch_id)
    # Another worker takes the batch over (as one would after this one stalled past its lease) and holds it 1 s.
    db = Database(server.database_url)
    try:
        with db.write() as conn:
            conn.execute(batches.update().where(batches.c.id == batch_id)
                         .values(lease_owner="another-worker", lease_expires_at=time.time() + 1))
    finally:
        db.dispose()
    engine.release("quick")
    wait_for(lambda: engine.stats()["in_flight"] == 3, "the quick answer")
    # Its flush finds the lease gone; the worker does not give up (or cut the calls) while three are in flight.
    assert engine.held("slow") == 3 and "lease lost" not in worker.log()
    engine.release("slow")
    wait_for(lambda: "lease lost" in worker.log(), "the worker to give the batch up", every=0.02)
    # The quick answer's flush found the lease gone; the three slow calls were answered before the worker gave
    # up, not cancelled (a cancelled call would run on in the HTTP client, holding its connection).
    assert engine.stats()["in_flight"] == 0
    # Once that lease lapses, a worker resumes the batch from what was made durable: one started now, on the
    # suite's short tick.
    start_worker(server, "resumer")
    batch = server.wait(batch_id, timeout=60)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
    out, err = results(server, batch)
    assert sorted(out) == sorted(f"l{i}" for i in range(total)) and err == {}
    assert batch["usage"] == usage_of(out)  # the records answered after the lease was lost are billed once
