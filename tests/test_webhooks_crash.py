"""kill -9 of `orl serve` around a webhook: after the batch's status is written and while its delivery is in
flight, the event is sent again after the restart (at least once, the same event id); before the status, no
event exists, and the batch's end after the restart sends exactly one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.execution import chat, create, wait_for
from tests.support.test_engine import EngineControl
from tests.support.webhook_receiver import Receiver, running_receiver
from tests.test_webhooks import FAST, delivery_log, hook_catalog, name, register, verified


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def test_kill_9_between_the_status_and_its_delivery(make_server, engine_url: str, receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver), env=FAST)
    hook = name()
    made = register(server, receiver.url(hook))
    receiver.hold(hook)  # the receiver takes the request and does not answer
    batch = create(server, [chat("k", "deliver me")])
    assert server.wait(batch["id"])["status"] == "completed"
    first = receiver.wait_for(hook, lambda r: len(r) == 1, "the delivery in flight")[0]
    assert first["answered"] is None
    server.kill()  # the status is written, the delivery's outcome never will be
    receiver.hold(hook, False)
    assert delivery_log(server, "--endpoint", made["id"]) == []

    server.start()
    got = receiver.wait_for(hook, lambda r: len(r) == 2 and r[1]["answered"] == 200, "the event after the restart")
    events = [verified(made["secret"], request) for request in got]
    assert events[0] == events[1] and events[0]["type"] == "batch.completed"
    assert events[0]["data"] == {"id": batch["id"]}
    assert got[0]["body"] == got[1]["body"] and got[0]["headers"]["webhook-id"] == got[1]["headers"]["webhook-id"]
    log = wait_for(lambda: delivery_log(server, "--endpoint", made["id"]), "the attempt in the log")
    assert [(a["attempt"], a["outcome"], a["delivery_state"]) for a in log] == [(1, "delivered", "delivered")]


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
