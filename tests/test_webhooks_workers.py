"""Webhooks sent by `orl worker` processes beside an API-only `orl serve --no-worker`: two workers sharing the
store's outbox deliver every event, each once while the receiver answers at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.batches import chat, create, wait_for
from tests.support.webhook_fixtures import FAST, hook_catalog
from tests.support.webhook_receiver import Receiver, running_receiver
from tests.test_webhooks import delivery_log, name, register, verified


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def test_two_workers_deliver_every_event_once(make_server, engine_url: str, receiver: Receiver, start_worker) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver), env=FAST, args=("--no-worker",))
    hook = name()
    made = register(server, receiver.url(hook))
    ids = [create(server, [chat(f"w{i}", f"batch {i}")])["id"] for i in range(8)]
    assert receiver.requests(hook) == []  # no worker: no batch has ended

    workers = [start_worker(server) for _ in range(2)]
    for batch_id in ids:
        assert server.wait(batch_id)["status"] == "completed"
    got = receiver.wait_for(hook, lambda r: len(r) >= len(ids), "an event per batch")
    events = [verified(made["secret"], r) for r in got]
    assert sorted(e["data"]["id"] for e in events) == sorted(ids)  # each batch's event, none twice
    log = wait_for(lambda: len(found := delivery_log(server, "--endpoint", made["id"])) == len(ids) and found,
                   "one attempt per event in the log")
    assert {a["outcome"] for a in log} == {"delivered"}
    assert len(receiver.requests(hook)) == len(ids)
    assert all(w.alive() for w in workers), "a worker died"
