"""Live progress numbers on the batch object (issue 14 part 4): ``openrelay.queue_position`` while queued, in the
order the scheduler's claims take; ``records_per_second``, ``tokens_per_second`` and ``eta_seconds`` while
running; null when unknown. Through the API, the official SDK and ``orl batches wait``; the queue's order and the
rolling record as plain functions. No figure is asserted by its value in time, only by its relations (known or
not, positive, consistent): the engine holds records until the test lets them go."""

from __future__ import annotations

import os
import subprocess
import time

import httpx

from openrelay.store.queue import LiveBatch, queue_order
from openrelay.store.throughput import WINDOW_SECONDS, add_flush, window_totals
from tests.support.batches import chat, create, get, wait_for
from tests.support.forked import ORL

SERVER_PER_MODULE = True  # test catalog: test/echo with 2 slots, concurrency 8

NULLS = {"queue_position": None, "records_per_second": None, "tokens_per_second": None, "eta_seconds": None,
         "concurrency_limit": None, "yielding": None}


def _create_as(server, api_key: str, records, priority: str = "standard") -> dict:
    answer = server.http("POST", "/batches", api_key=api_key, json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": records, "priority": priority})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _numbers(server, batch_id: str, api_key: str | None = None) -> dict:
    answer = server.http("GET", f"/batches/{batch_id}", api_key=api_key)
    assert answer.status_code == 200, answer.text
    return answer.json()["openrelay"]


def _running(server, batch_id: str) -> dict:
    return wait_for(lambda: (b := get(server, batch_id))["in_progress_at"] is not None and b,
                    f"batch {batch_id} to start")


def _queued(server, batch_id: str, api_key: str | None = None) -> None:
    wait_for(lambda: _numbers(server, batch_id, api_key)["queue_position"] is not None,
             f"batch {batch_id} to be queued")


def test_queue_position_follows_the_claims_order_and_moves_up(server, engine):
    other = server.new_org_key()
    # Two running batches of this organization fill test/echo's two slots.
    first = create(server, [chat("r1", "first #hold=first")])
    second = create(server, [chat("r2", "second #hold=second")])
    _running(server, first["id"])
    _running(server, second["id"])
    engine.wait_held("first")
    engine.wait_held("second")
    assert first["openrelay"] == NULLS  # the create's answer, at validating: nothing known yet

    a1 = create(server, [chat("a1", "a1 #hold=q")])
    a2 = create(server, [chat("a2", "a2 #hold=q")])
    b1 = _create_as(server, other, [chat("b1", "b1 #hold=q")])
    e1 = create(server, [chat("e1", "e1 #hold=q")], priority="expedited")
    for batch in (a1, a2, e1):
        _queued(server, batch["id"])
    _queued(server, b1["id"], other)

    # Expedited first; then fair share: the other organization runs nothing, this one two (three with e1).
    # (A process reuses a poll's answer for up to OPENRELAY_POLL_CACHE_SECONDS: positions are polled until they agree.)
    expected = {e1["id"]: 1, b1["id"]: 2, a1["id"]: 3, a2["id"]: 4}

    def numbers_if_expected() -> dict | None:
        found = {batch_id: _numbers(server, batch_id, other if batch_id == b1["id"] else None)
                 for batch_id in expected}
        return found if {b: n["queue_position"] for b, n in found.items()} == expected else None

    seen = wait_for(numbers_if_expected, f"the positions {expected}")
    for numbers in seen.values():  # queued: no rate, no ETA
        assert numbers["records_per_second"] is None and numbers["eta_seconds"] is None
    running = _numbers(server, first["id"])
    assert running["queue_position"] is None

    # The list page shows the same numbers on its rows; the SDK reads them as an extra field.
    page = server.http("GET", "/batches", params={"limit": 100}).json()["data"]
    assert {row["id"]: row["openrelay"]["queue_position"] for row in page if row["id"] in expected} == {
        e1["id"]: 1, a1["id"]: 3, a2["id"]: 4}
    sdk = server.client().batches.retrieve(a2["id"])
    assert sdk.model_extra["openrelay"]["queue_position"] == 4

    # One slot frees: the claim takes position 1, and everyone behind moves up in the same order.
    engine.release("first")
    assert server.wait(first["id"])["status"] == "completed"
    assert _running(server, e1["id"])["openrelay"]["queue_position"] is None
    assert get(server, a1["id"])["in_progress_at"] is None
    wait_for(lambda: [_numbers(server, b1["id"], other)["queue_position"], _numbers(server, a1["id"])["queue_position"],
                      _numbers(server, a2["id"])["queue_position"]] == [1, 2, 3], "b1, a1, a2 to move up")
    engine.release("second")
    assert server.wait(second["id"])["status"] == "completed"
    wait_for(lambda: server.http("GET", f"/batches/{b1['id']}", api_key=other).json()["in_progress_at"],
             "b1 to start")
    assert get(server, a1["id"])["in_progress_at"] is None
    wait_for(lambda: [_numbers(server, a1["id"])["queue_position"], _numbers(server, a2["id"])["queue_position"]]
             == [1, 2], "a1, a2 to move up")
    engine.release("q")
    for batch in (a1, a2, e1):
        assert server.wait(batch["id"])["openrelay"] == NULLS  # finished: nothing left to measure
    assert server.wait(b1["id"], api_key=other)["openrelay"] == NULLS


def test_running_batch_has_rates_and_an_eta_once_records_land(server, engine):
    batch = create(server, [chat(f"r{i}", f"record {i} #hold=rate") for i in range(12)])
    _running(server, batch["id"])
    engine.wait_held("rate", 8)  # concurrency 8: eight in flight, none finished
    # The worker shows the concurrency it runs at (the model's fixed 8) once it has written it.
    before = wait_for(lambda: (n := _numbers(server, batch["id"]))["concurrency_limit"] and n, "the limit shown")
    # No record durable yet: the rates are unknown, not zero; no load_metrics: not yielding.
    assert before == {**NULLS, "concurrency_limit": 8, "yielding": False}

    engine.release("rate", count=4)
    landed = wait_for(lambda: (b := get(server, batch["id"]))["request_counts"]["completed"] >= 4 and b,
                      "four records to be durable")
    numbers = landed["openrelay"]
    assert numbers["queue_position"] is None
    assert numbers["records_per_second"] > 0 and numbers["tokens_per_second"] > 0
    # tokens per record (input + output) over records: the usage so far bounds it
    usage = landed["usage"]
    assert numbers["tokens_per_second"] / numbers["records_per_second"] <= usage["total_tokens"] + 1
    left = 12 - landed["request_counts"]["completed"] - landed["request_counts"]["failed"]
    assert isinstance(numbers["eta_seconds"], int) and numbers["eta_seconds"] >= 1 and left > 0

    # The SDK sees them too; the list page's row carries the same kind of numbers.
    extra = server.client().batches.retrieve(batch["id"]).model_extra["openrelay"]
    assert extra["records_per_second"] > 0 and extra["eta_seconds"] >= 1
    # A page's answer is reused for up to OPENRELAY_POLL_CACHE_SECONDS (api/poll_cache.py), so its rates may lag
    # the batch's own poll by that much.
    row = wait_for(lambda: next((r for r in server.http("GET", "/batches").json()["data"]
                                 if r["id"] == batch["id"] and r["openrelay"]["records_per_second"]), None),
                   "the list page's row to show the rates")
    assert row["openrelay"]["records_per_second"] > 0 and row["openrelay"]["queue_position"] is None

    # Cancelling: records in flight still finish, so the rates stay; no ETA (the rest will not run).
    cancelling = server.http("POST", f"/batches/{batch['id']}/cancel").json()
    assert cancelling["status"] == "cancelling"
    assert cancelling["openrelay"]["records_per_second"] > 0 and cancelling["openrelay"]["eta_seconds"] is None
    engine.release("rate")
    assert server.wait(batch["id"])["openrelay"] == NULLS


def test_orl_wait_shows_the_numbers_beside_its_progress(server, engine):
    batch = create(server, [chat(f"w{i}", f"wait {i} #hold=wait") for i in range(10)])
    _running(server, batch["id"])
    engine.wait_held("wait", 8)
    engine.release("wait", count=3)
    wait_for(lambda: get(server, batch["id"])["openrelay"]["records_per_second"], "a first rate")
    env = {**os.environ, "OPENRELAY_BASE_URL": server.base_url, "OPENRELAY_API_KEY": server.api_key}
    proc = subprocess.Popen([ORL, "batches", "wait", batch["id"], "--interval", "0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        lines = []
        while not any("rec/s" in line for line in lines):  # its stderr is a pipe: a line whenever they change
            assert time.monotonic() < deadline, lines
            lines.append(proc.stderr.readline())
        shown = next(line for line in lines if "rec/s" in line)
        assert "tok/s" in shown and "ETA " in shown and "/10" in shown, shown
        engine.release("wait")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert '"status": "completed"' in out


def test_queued_batch_in_the_wait_shows_its_place(server, engine):
    hold = [create(server, [chat(f"h{i}", f"hold {i} #hold=slot")]) for i in range(2)]
    for batch in hold:
        _running(server, batch["id"])
    queued = create(server, [chat("q", "queued")])
    _queued(server, queued["id"])
    env = {**os.environ, "OPENRELAY_BASE_URL": server.base_url, "OPENRELAY_API_KEY": server.api_key}
    proc = subprocess.Popen([ORL, "batches", "wait", queued["id"], "--interval", "0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        assert "in_progress (queued)" in first and "queue #1" in first, first
        engine.release("slot")
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0


# -- the pieces, as plain functions ----------------------------------------------------------------------------


def _live(batch_id: str, org: str, created: int, *, priority: str = "standard", started: bool = False,
          status: str = "in_progress") -> LiveBatch:
    return LiveBatch(id=batch_id, org_id=org, priority=priority, created_ns=created, started=started, status=status)


def test_queue_order_replays_the_claims():
    rows = [
        _live("running-a", "A", 0, started=True),
        _live("cancelling-b", "B", 1, started=True, status="cancelling"),  # still holds its slot
        _live("a1", "A", 2), _live("a2", "A", 3), _live("b1", "B", 4), _live("c1", "C", 5), _live("c2", "C", 6),
        _live("x-c", "C", 9, priority="expedited"),
        _live("finalizing", "A", 10, status="finalizing"),  # not queued
    ]
    # x-c first (expedited); then C has 1 running (x-c), A 1, B 1: oldest first among equals: a1, b1, c1;
    # then a2 (A's second), c2 (C's second), in age order.
    assert queue_order(rows) == {"x-c": 1, "a1": 2, "b1": 3, "c1": 4, "a2": 5, "c2": 6}
    assert queue_order([]) == {}
    # One organization's many batches do not hold back another's one.
    many = [_live(f"m{i}", "M", i) for i in range(50)] + [_live("late", "L", 100)]
    assert queue_order(many)["late"] == 2


def test_queue_order_goes_by_turns_when_the_running_counts_tie():
    def live(batch_id: str, org: str, created: int, turn: float | None, **kwargs) -> LiveBatch:
        return LiveBatch(id=batch_id, org_id=org, priority="standard", created_ns=created, started=False,
                         status="in_progress", org_last_start=turn, **kwargs)

    # Nothing runs (one slot, just freed): the organization whose last batch started longest ago goes first (one
    # that never started one before all), then the oldest batch; each start sends its organization to the back.
    rows = [live("a1", "A", 1, 300.0), live("a2", "A", 2, 300.0), live("a3", "A", 3, 300.0),
            live("c1", "C", 5, 200.0), live("b1", "B", 4, None), live("b2", "B", 6, None)]
    assert queue_order(rows) == {"b1": 1, "c1": 2, "a1": 3, "b2": 4, "a2": 5, "a3": 6}
    # Fewer running still comes first: C's running batch outweighs its older turn.
    running_c = LiveBatch(id="c0", org_id="C", priority="standard", created_ns=0, started=True, status="in_progress",
                          org_last_start=200.0)
    assert queue_order([running_c, live("c1", "C", 5, 200.0), live("a1", "A", 1, 300.0)]) == {"a1": 1, "c1": 2}


def test_the_rolling_record_keeps_only_the_last_minute():
    window = None
    for second in range(1000, 1300):  # five minutes of flushes, several per second
        for _ in range(3):
            window = add_flush(window, second + 0.5, 2, 10)
    assert window is not None and window.count("[") <= WINDOW_SECONDS + 2  # bounded, whatever ran before
    assert window_totals(window, 1299.9) == (2 * 3 * WINDOW_SECONDS, 10 * 3 * WINDOW_SECONDS)
    assert window_totals(window, 1299.9 + WINDOW_SECONDS) == (0, 0)  # a minute of nothing: known to be zero
    assert window_totals(None, 1299.9) is None  # nothing ever flushed: unknown


def _signed_in(server) -> httpx.Client:
    """A dashboard session of the test's organization, over plain HTTP."""
    client = httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=30)
    client.get("/login")
    token = client.cookies["orl_login"]
    signed = client.post("/login", data={"csrf": token, "api_key": server.api_key})
    assert signed.status_code in (302, 303), signed.text
    return client


def test_the_dashboard_shows_the_same_numbers(server, engine):
    hold = [create(server, [chat(f"d{i}", f"dash {i} #hold=dash") for i in range(3)]) for _ in range(2)]
    for batch in hold:
        _running(server, batch["id"])
    engine.wait_held("dash", 6)
    queued = create(server, [chat("dq", "queued")])
    _queued(server, queued["id"])
    engine.release("dash", count=2)
    wait_for(lambda: _numbers(server, hold[0]["id"])["records_per_second"] or
             _numbers(server, hold[1]["id"])["records_per_second"], "a first rate")
    client = _signed_in(server)
    try:
        live = client.get(f"/batches/{queued['id']}", params={"fragment": "live"}).text
        assert 'data-live="queue-position">1<' in live
        running = next(b for b in hold if _numbers(server, b["id"])["records_per_second"])
        live = client.get(f"/batches/{running['id']}", params={"fragment": "live"}).text
        assert 'data-live="records-per-second">' in live and "tokens/s over the last minute" in live
        assert 'data-live="queue-position">#1<' in client.get("/").text  # the Batch page's row
    finally:
        client.close()
    engine.release("dash")
