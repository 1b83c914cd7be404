"""kill -9 of `orl serve` around a webhook: after the batch's status is written and while its delivery is in
flight, the event is sent again after the restart (at least once, the same event id); before the status, no
event exists, and the batch's end after the restart sends exactly one."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.batches import chat, create, wait_for
from tests.support.test_engine import EngineControl
from tests.support.webhook_fixtures import FAST, hook_catalog
from tests.support.webhook_receiver import Receiver, running_receiver
from tests.test_webhooks import delivery_log, name, register, verified


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def test_kill_9_between_the_status_and_its_delivery(make_server, engine_url: str, receiver: Receiver) -> None:
    # An attempt may wait 5 s for its answer (its claim then lapses 11 s after it was taken), so the kill comes
    # while it waits; were this machine slower than that, the timed-out attempt would be logged as failed.
    server = make_server(catalog=hook_catalog(engine_url, receiver),
                         env={**FAST, "OPENRELAY_WEBHOOK_TIMEOUT_SECONDS": "5"})
    hook = name()
    made = register(server, receiver.url(hook))
    receiver.hold(hook)  # the receiver takes the request and does not answer
    batch = create(server, [chat("k", "deliver me")])
    assert server.wait(batch["id"])["status"] == "completed"
    first = receiver.wait_for(hook, lambda r: len(r) >= 1, "the delivery in flight")[-1]
    assert first["answered"] is None
    server.kill()  # the status is written, the delivery's outcome never will be
    receiver.hold(hook, False)
    before = delivery_log(server, "--endpoint", made["id"])
    assert all(a["outcome"] == "failed" for a in before)  # empty, unless the attempt timed out before the kill

    restarted_at = time.time()
    server.start()
    got = receiver.wait_for(hook, lambda r: any(x["received_at"] > restarted_at and x["answered"] == 200 for x in r),
                            "the event after the restart")
    events = [verified(made["secret"], request) for request in got]
    assert all(event == events[0] for event in events) and events[0]["type"] == "batch.completed"
    assert events[0]["data"] == {"id": batch["id"]}
    assert {r["body"] for r in got} == {first["body"]} and {r["headers"]["webhook-id"] for r in got} == {
        events[0]["id"]}
    log = wait_for(lambda: (found := delivery_log(server, "--endpoint", made["id"]))
                   and found[0]["outcome"] == "delivered" and found, "the delivered attempt in the log")
    assert len(log) == len(before) + 1 and {a["delivery_state"] for a in log} == {"delivered"}


def test_kill_9_before_the_status_sends_exactly_one_event(make_server, engine: EngineControl, engine_url: str,
                                                          receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver), env=FAST)
    hook = name()
    made = register(server, receiver.url(hook))
    gate = f"crash-{hook}"
    batch = create(server, [chat(f"c{i}", f"run {i} #hold={gate}") for i in range(4)])
    engine.wait_held(gate, 4)
    server.kill()  # mid-run: no status, so no event
    engine.release(gate)  # the held calls answer a dead worker; after the restart the gate stays open
    assert receiver.requests(hook) == []

    server.start()
    done = server.wait(batch["id"])
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 4
    got = receiver.wait_for(hook, lambda r: len(r) == 1 and r[0]["answered"] == 200, "the one event")
    event = verified(made["secret"], got[0])
    assert event["type"] == "batch.completed" and event["data"] == {"id": batch["id"]}
    log = wait_for(lambda: delivery_log(server, "--endpoint", made["id"]), "the attempt in the log")
    assert [a["event_id"] for a in log] == [event["id"]]
    assert len(receiver.requests(hook)) == 1
