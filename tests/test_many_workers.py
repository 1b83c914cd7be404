"""Several `orl worker` processes on one store: every claim is atomic, a model's slots and a batch's concurrency hold
in sum over all of them, queues are shared fairly between organizations, a killed worker's batch resumes on another,
and SIGTERM drains. The API runs with --no-worker; the engine's held requests show what is in flight."""

from __future__ import annotations

import signal
from collections import Counter

from tests.support.batches import chat, create, get, results
from tests.support.polling import wait_for
from tests.support.server import Server
from tests.support.workers import WorkerProcess


def _every_worker_has_looked(server: Server, pool: list[WorkerProcess]) -> None:
    """Wait until each worker of ``pool`` has made whole claim passes since now. Batches cancelled for the purpose
    (they need no slot, and none reaches the engine) are made one at a time, each once the one before has ended,
    until every worker has ended two: its claim pass that took the first had ended before the one that took the
    second began, and a pass claims every batch the worker may take, so a batch it should not take but would have
    is taken (and logged) by then."""
    taken = [0] * len(pool)
    for n in range(200):
        made = create(server, [chat(f"probe-{n}", "never sent #hold=probe")])["id"]
        assert server.http("POST", f"/batches/{made}/cancel").status_code == 200
        assert server.wait(made)["status"] == "cancelled"
        taken = [count + worker.took(made) for count, worker in zip(taken, pool, strict=True)]
        if min(taken) >= 2:
            return
    raise AssertionError(f"each worker did not end two of 200 cancelled batches: {taken}")


def _api_only(make_server, **kwargs) -> Server:
    return make_server(args=("--no-worker",), **kwargs)


def _sent(engine) -> Counter[str]:
    return Counter(r["body"]["messages"][0]["content"] for r in engine.requests())


def test_max_batches_caps_each_worker_so_a_fleet_shares_the_slots(make_server, engine, start_worker):
    server = _api_only(make_server, slots=3, concurrency=2)
    first, second = [start_worker(server, args=("--max-batches", "1")) for _ in range(2)]
    ids = [create(server, [chat(f"b{b}-{i}", f"batch {b} record {i} #hold=capped") for i in range(4)])["id"]
           for b in range(3)]
    engine.wait_held("capped", 4)  # two batches, one per worker, two calls each: the model's third slot is free
    _every_worker_has_looked(server, [first, second])  # neither capped worker may take the third batch
    assert engine.held("capped") == 4
    assert sum(get(server, i)["in_progress_at"] is not None for i in ids) == 2
    running = [i for i in ids if get(server, i)["in_progress_at"] is not None]
    assert [first.took(i) for i in running].count(True) == 1 and [second.took(i) for i in running].count(True) == 1
    (waiting,) = set(ids) - set(running)
    assert not first.took(waiting) and not second.took(waiting)
    engine.release("capped")
    for batch_id in ids:
        done = server.wait(batch_id, timeout=180)
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 4
    assert engine.stats()["max_in_flight"] == 4


def test_three_workers_keep_slots_and_concurrency_in_sum_and_run_each_record_once(make_server, engine,
                                                                                 start_worker):
    server = _api_only(make_server, slots=2, concurrency=4)
    pool = [start_worker(server) for _ in range(3)]
    ids = [create(server, [chat(f"b{b}-{i}", f"batch {b} record {i} #hold=all") for i in range(10)])["id"]
           for b in range(6)]
    engine.wait_held("all", 8)  # two batches (the model's slots) of four calls each (its concurrency)
    _every_worker_has_looked(server, pool)  # none may add a call
    assert engine.held("all") == 8
    assert sum(get(server, i)["in_progress_at"] is not None for i in ids) == 2
    assert sum(worker.took(i) for worker in pool for i in ids) == 2  # and none took a third batch
    engine.release("all")
    for batch_id in ids:
        done = server.wait(batch_id, timeout=180)
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 10
        results(server, done)  # each custom_id on one line
    assert engine.stats()["max_in_flight"] == 8
    sent = _sent(engine)
    assert len(sent) == 60 and set(sent.values()) == {1}  # no batch was held by two workers at once


def test_one_of_three_workers_killed_mid_batch_its_batch_resumes_elsewhere_and_lands_once(make_server, engine,
                                                                                        start_worker):
    server = _api_only(make_server, slots=1, concurrency=4)
    pool = [start_worker(server) for _ in range(3)]
    batch_id = create(server, [chat(f"k{i}", f"record {i} #hold=k") for i in range(12)])["id"]
    engine.wait_held("k", 4)
    (holder,) = [w for w in pool if w.took(batch_id)]
    holder.kill()  # kill -9: no drain, the lease is left to lapse
    engine.wait_held("k", 8)  # the lease lapsed and another worker sent the four unfinished records again
    engine.release("k")
    done = server.wait(batch_id, timeout=120)
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    out, err = results(server, done)
    assert sorted(out) == sorted(f"k{i}" for i in range(12)) and err == {}
    sent = _sent(engine)
    assert sum(sent.values()) == 16 and sorted(sent.values()).count(2) == 4  # only the four in flight, twice
    assert sum(w.took(batch_id) for w in pool) == 2  # the killed worker, then exactly one other


def test_queues_are_shared_fairly_between_organizations(make_server, engine, start_worker):
    server = _api_only(make_server, slots=2, concurrency=1)
    a_key, b_key = server.new_org_key(), server.new_org_key()

    def create_as(key: str, name: str) -> str:
        resp = server.http("POST", "/batches", api_key=key, json={
            "endpoint": "/v1/chat/completions", "completion_window": "24h",
            "requests": [chat(f"{name}-0", f"{name} #hold=fair")]})
        assert resp.status_code == 200, resp.text
        return resp.json()["id"]

    a_ids = [create_as(a_key, f"a{i}") for i in range(3)]
    b_id = create_as(b_key, "b0")  # the newest of the four, from the organization with nothing running
    start_worker(server)  # every batch is queued before the first claim
    engine.wait_held("fair", 2)
    started = {bid for bid, key in [*((i, a_key) for i in a_ids), (b_id, b_key)]
               if server.http("GET", f"/batches/{bid}", api_key=key).json()["in_progress_at"] is not None}
    assert started == {a_ids[0], b_id}  # not a1: organization a already has a batch running
    engine.release("fair")
    for bid, key in [*((i, a_key) for i in a_ids), (b_id, b_key)]:
        assert server.wait(bid, api_key=key)["status"] == "completed"


def test_sigterm_drains_a_worker_its_calls_finish_and_the_batch_is_handed_back(make_server, engine, start_worker):
    server = _api_only(make_server, slots=1, concurrency=4, env={"OPENRELAY_DRAIN_SECONDS": "120"})
    first = start_worker(server)
    batch_id = create(server, [chat(f"t{i}", f"record {i} #hold=t") for i in range(12)])["id"]
    engine.wait_held("t", 4)
    first.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping" in first.log(), "the worker to start its drain")
    engine.release("t")  # the four calls in flight answer; the draining worker takes no new record
    assert first.proc.wait(60) == 0
    assert "8 records left for the next worker" in first.log()
    assert get(server, batch_id)["request_counts"]["completed"] == 4  # made durable before handing back
    second = start_worker(server)  # the lease was handed back: no wait for it to lapse
    done = server.wait(batch_id, timeout=120)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 12
    sent = _sent(engine)
    assert len(sent) == 12 and set(sent.values()) == {1}  # nothing ran twice: the drain lost nothing in flight
    assert second.took(batch_id)

