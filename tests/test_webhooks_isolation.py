"""A slow or failing webhook endpoint delays only its own deliveries (issue 34), on a real store (SQLite, or
PostgreSQL) shared by several delivery loops, against a real receiver process whose hostile endpoints hang,
trickle their answer or answer 500, held until the test lets them go: other organizations' events are delivered
meanwhile, no endpoint has more than its concurrency in flight, and an attempt ends at its timeout, connect to
last byte, so that one delivery is never sent twice at once.

The store's side (each endpoint's concurrency and circuit) is in tests/unit/test_webhooks_store.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from openrelay.store.db import Database
from tests.support.polling import wait_for
from tests.support.store_rows import fresh_database
from tests.support.webhook_loops import WebhookStores, quick_settings, receiver_catalog, running_loops
from tests.support.webhook_receiver import Receiver
from tests.unit.test_webhooks_store import _events, _finalize, _org_and_key, _running_batch

LOOPS = 3  # delivery loops sharing the store, as three workers' do


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        yield database


def _endpoint(store: WebhookStores, org_id: str, receiver: Receiver, hook: str) -> str:
    endpoint = store.endpoints.add_endpoint(org_id, receiver.url(hook), "whsec_" + "A" * 44, limit=16)
    assert endpoint is not None
    return endpoint.id


def _ended_batch(db: Database, org: tuple[str, str]) -> str:
    """A batch of ``org`` ended now; its event's id."""
    batch_id = _running_batch(db, *org)
    _finalize(db, batch_id, org[0])
    [(event_id, _type)] = _events(db, batch_id)
    return event_id


def test_hostile_endpoints_delay_only_their_own_deliveries(db: Database, receiver: Receiver, tmp_path) -> None:
    settings = quick_settings(tmp_path, timeout_seconds=600.0)  # hanging attempts last until the test lets them go
    store, tag = WebhookStores.of(db), secrets.token_hex(3)
    hostile_org = _org_and_key(db)
    hostile = {f"{kind}{i}-{tag}": kind for i, kind in enumerate(["hang"] * 6 + ["trickle"] * 5 + ["fail"] * 5)}
    for hook, kind in hostile.items():
        if kind == "hang":
            receiver.hold(hook)
        elif kind == "trickle":
            receiver.trickle(hook, every=0.5)
        else:
            receiver.fail(hook, 10 ** 6, status=500)
        _endpoint(store, hostile_org[0], receiver, hook)
    for _ in range(6):  # 96 deliveries: more than three loops took in a round before, each waiting for its slowest
        _ended_batch(db, hostile_org)

    with running_loops(store, receiver_catalog(receiver), settings, LOOPS):
        try:
            for hook, kind in hostile.items():
                receiver.wait_for(hook, lambda got: len(got) >= 1, f"the {kind} endpoint's first attempt")
            # Three other organizations' batches end now, each with a healthy endpoint.
            healthy = {}
            for i in range(3):
                org, hook = _org_and_key(db), f"healthy{i}-{tag}"
                healthy[hook] = (_endpoint(store, org[0], receiver, hook), _ended_batch(db, org))
            for hook, (endpoint_id, event_id) in healthy.items():
                receiver.wait_for(hook, lambda got: [r["answered"] for r in got] == [200], "a healthy delivery")
                wait_for(lambda: store.delivery_states(event_id) == {endpoint_id: "delivered"},  # noqa: B023
                         "the delivery recorded")
            # ... while every hanging and trickling attempt is still open, none past its endpoint's concurrency.
            for hook, kind in hostile.items():
                got = receiver.requests(hook)
                if kind != "fail":
                    assert [r["answered"] for r in got] == [None] * len(got), (hook, got)
                assert max(r["open_beside"] for r in got) < settings.webhooks.endpoint_concurrency, (hook, got)
                assert not any(r["overlapped"] for r in got), (hook, got)
        finally:
            for hook, kind in hostile.items():
                if kind == "hang":
                    receiver.hold(hook, False)
                elif kind == "trickle":
                    receiver.trickle(hook, None)


def test_an_attempt_ends_at_its_timeout_and_is_never_sent_twice_at_once(db: Database, receiver: Receiver,
                                                                         tmp_path) -> None:
    # The answer's head comes a byte every 0.1 s, so that no read ever waits a second; the attempt still ends at
    # one second, and the claim (three seconds) outlives it.
    settings = quick_settings(tmp_path, timeout_seconds=1.0)
    store, hook = WebhookStores.of(db), f"trickle-{secrets.token_hex(3)}"
    org = _org_and_key(db)
    receiver.trickle(hook, every=0.1)
    endpoint_id = _endpoint(store, org[0], receiver, hook)
    _ended_batch(db, org)
    with running_loops(store, receiver_catalog(receiver), settings, LOOPS):
        try:
            log = wait_for(lambda: len(found := store.log.attempts(endpoint_id=endpoint_id)) >= 2 and found,
                           "two attempts ended by the timeout")
            assert {(a.outcome, a.status_code, a.error) for a in log} == {
                ("failed", None, "no answer within the timeout (1 s)")}
            got = receiver.requests(hook)
            assert len(got) >= 2 and not any(r["overlapped"] for r in got), got
            assert {r["answered"] for r in got} == {None}  # the receiver never got to finish one
        finally:
            receiver.trickle(hook, None)
