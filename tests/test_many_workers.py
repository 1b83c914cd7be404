"""Several `orl worker` processes on one store: every claim is atomic, a model's slots and a batch's concurrency hold
in sum over all of them, queues are shared fairly between organizations, a killed worker's batch resumes on another,
and SIGTERM drains. The API runs with --no-worker; the engine's held requests show what is in flight."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from importlib import metadata
from unittest.mock import ANY

from prometheus_client.parser import text_string_to_metric_families

from tests.support import http_client
from tests.support.batches import chat, create, get, post_batch, results
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


def _create_as(server: Server, key: str, name: str, hold: str) -> str:
    """A batch of one record, held at the engine's gate ``hold``; its id."""
    resp = post_batch(server, api_key=key, endpoint="/v1/chat/completions", completion_window="24h",
                      requests=[chat(f"{name}-0", f"{name} #hold={hold}")])
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def test_queues_are_shared_fairly_between_organizations(make_server, engine, start_worker):
    server = _api_only(make_server, slots=2, concurrency=1)
    a_key, b_key = server.new_org_key(), server.new_org_key()

    def create_as(key: str, name: str) -> str:
        return _create_as(server, key, name, hold="fair")

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


def _shares(server: Server) -> dict[str, dict[str, float]]:
    """``/metrics``' share of each organization (by name) of test/echo: {organization: {metric: value}}."""
    text = http_client.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    shares: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("openrelay_org_") and sample.labels.get("model") == "test/echo":
                shares.setdefault(sample.labels["organization"], {})[sample.name] = sample.value
    return shares


def test_one_slot_goes_round_the_organizations_by_their_turns(make_server, engine, start_worker):
    """Issue 24's case: with one slot nobody runs when it frees, so "fewest running" ties and each organization's
    turn (when its last batch of the model started) decides. A queues five batches; B and C one each while A's first
    runs: B's and C's start before A's second, on two workers claiming at once."""
    server = _api_only(make_server, slots=1, concurrency=1)
    keys = {org: server.new_org_key(f"turns-{org}") for org in "abc"}
    for _ in range(2):
        start_worker(server)
    names = [f"a{i}" for i in range(5)] + ["b0", "c0"]
    ids = {name: _create_as(server, keys["a"], name, hold=f"turns-{name}") for name in names[:5]}
    engine.wait_held("turns-a0")  # A's first holds the only slot; its other four wait
    ids |= {name: _create_as(server, keys[name[0]], name, hold=f"turns-{name}") for name in names[5:]}
    # The queue positions replay the same turns (a process reuses a model's queue briefly: poll until they agree).
    expected = {"b0": 1, "c0": 2, "a1": 3, "a2": 4, "a3": 5, "a4": 6}
    wait_for(lambda: {name: get(server, ids[name], keys[name[0]])["openrelay"]["queue_position"]
                      for name in expected} == expected, f"the positions {expected}")

    def the_one_started(left: set[str]) -> str | None:
        gates = engine.gates()
        waiting = [name for name in left if gates.get(f"turns-{name}", {}).get("waiting")]
        assert len(waiting) <= 1, waiting  # one slot, one record per batch
        return waiting[0] if waiting else None

    order = ["a0"]
    engine.release("turns-a0")
    while len(order) < len(names):
        order.append(wait_for(lambda: the_one_started(set(names) - set(order)), "the next batch to start"))
        if order[-1] == "c0":  # every organization has had a turn; C holds the slot now
            assert _shares(server) == {
                "turns-a": {"openrelay_org_batches_running": 0, "openrelay_org_batches_queued": 4,
                            "openrelay_org_batches_started_total": 1,
                            "openrelay_org_last_start_timestamp_seconds": ANY},
                "turns-b": {"openrelay_org_batches_running": 0, "openrelay_org_batches_queued": 0,
                            "openrelay_org_batches_started_total": 1,
                            "openrelay_org_last_start_timestamp_seconds": ANY},
                "turns-c": {"openrelay_org_batches_running": 1, "openrelay_org_batches_queued": 0,
                            "openrelay_org_batches_started_total": 1,
                            "openrelay_org_last_start_timestamp_seconds": ANY}}
            turns = {org: share["openrelay_org_last_start_timestamp_seconds"]
                     for org, share in _shares(server).items()}
            assert turns["turns-a"] < turns["turns-b"] < turns["turns-c"]
        engine.release(f"turns-{order[-1]}")
    assert order == ["a0", "b0", "c0", "a1", "a2", "a3", "a4"]
    for name, batch_id in ids.items():
        assert server.wait(batch_id, api_key=keys[name[0]])["status"] == "completed"


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



def _live_workers(server: Server) -> list[dict]:
    listed = server.admin("workers")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def test_workers_register_split_the_slots_by_themselves_and_one_gone_drops_off(make_server, engine, start_worker):
    """No --max-batches: two workers take two of a model's four slots each; `orl admin workers` lists both with
    the batches each holds; one killed drops off after its lease, and the other, alone, takes every slot."""
    server = _api_only(make_server, slots=4, concurrency=1)
    first, second = start_worker(server), start_worker(server)
    wait_for(lambda: all("live workers serving test/echo 2" in w.log() for w in (first, second)),
             "each worker to count the other")
    ids = [create(server, [chat(f"s{b}", f"batch {b} #hold=spread")])["id"] for b in range(6)]
    engine.wait_held("spread", 4)  # the model's four slots
    assert [sum(w.took(i) for i in ids) for w in (first, second)] == [2, 2]
    listed = {w["pid"]: w for w in _live_workers(server)}
    assert set(listed) == {first.proc.pid, second.proc.pid}
    for seen in listed.values():
        assert seen == {"id": ANY, "host": os.uname().nodename, "pid": ANY, "version": metadata.version("openrelay"),
                        "models": ["test/echo", "test/embed"], "batches_held": 2, "started_at": ANY,
                        "last_seen_at": ANY}
        assert seen["started_at"] <= seen["last_seen_at"]
    orphans = [i for i in ids if second.took(i)]
    second.kill()  # kill -9: its row and its two leases lapse (OPENRELAY_LEASE_SECONDS=3)
    wait_for(lambda: "live workers serving test/echo 1" in first.log(), "the killed worker to drop off")
    wait_for(lambda: all(first.took(i) for i in orphans), "the worker left to take every slot")
    (alone,) = _live_workers(server)
    assert alone["pid"] == first.proc.pid and alone["batches_held"] == 4
    engine.release("spread")
    for batch_id in ids:
        assert server.wait(batch_id, timeout=120)["status"] == "completed"
    assert sum(first.took(i) for i in ids) == 6


def test_a_worker_stopped_cleanly_leaves_the_live_workers_at_once(make_server, start_worker):
    """SIGTERM (a rolling restart): the worker drains and deletes its row, so it is gone from `orl admin workers`
    long before its lease (here 60 s) would have lapsed."""
    server = _api_only(make_server, slots=2, concurrency=1, env={"OPENRELAY_LEASE_SECONDS": "60"})
    first, second = start_worker(server), start_worker(server)
    assert {w["pid"] for w in _live_workers(server)} == {first.proc.pid, second.proc.pid}
    assert second.stop() == 0
    assert [w["pid"] for w in _live_workers(server)] == [first.proc.pid]


def test_a_batch_that_ends_hands_its_slot_to_the_next_at_once_not_a_tick_later(make_server, engine, start_worker):
    """The claim loop runs every tick and also when one of its batches ends: with a tick of 60 s, the queued batch
    takes the freed slot well before the next tick would come (the engine's gate says when it starts)."""
    server = _api_only(make_server, slots=1, concurrency=1,
                       env={"OPENRELAY_TICK_SECONDS": "60", "OPENRELAY_LEASE_SECONDS": "180"})
    first = create(server, [chat("w0", "first #hold=wake-first")])["id"]
    second = create(server, [chat("w1", "second #hold=wake-second")])["id"]
    start_worker(server)  # its first tick queues both and starts the first in the only slot
    engine.wait_held("wake-first")
    assert engine.held("wake-second") == 0
    engine.release("wake-first")
    engine.wait_held("wake-second", timeout=30)  # half the tick: only the wake at the first's end can start it
    engine.release("wake-second")
    for batch_id in (first, second):
        assert server.wait(batch_id)["status"] == "completed"
