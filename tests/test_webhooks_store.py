"""The webhook outbox on a real store (SQLite in a temp dir, or a fresh PostgreSQL database): the event is
written by the transaction that writes the terminal status and by no other; deliveries are claimed by one loop
at a time however many claim at once; an attempt's outcome is fenced by its claim; giving up; event filters,
secret rotation, replays and pruning the log."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from openrelay.errors import Conflict, NotFound, StoreError
from openrelay.ids import new_batch_id, now, now_ns
from openrelay.store.accounts import Accounts
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.leases import BatchLeases
from openrelay.store.results import LeaseLost, Results
from openrelay.store.schema import webhook_deliveries, webhook_events
from openrelay.store.webhook_log import PrunedLog
from openrelay.store.webhooks import WebhookStore
from openrelay.types import Batch, BatchStatus
from tests.support.store_rows import fresh_database


@pytest.fixture
def db(tmp_path) -> Iterator[Database]:
    with fresh_database(tmp_path) as database:
        yield database


def _org_and_key(db: Database) -> tuple[str, str]:
    accounts = Accounts(db)
    org = accounts.create_org(f"org-{now_ns()}")
    key, _secret = accounts.create_key(org.id)
    return org.id, key.id


def _running_batch(db: Database, org_id: str, key_id: str, worker: str = "w1") -> str:
    """A batch leased by ``worker``, as a worker holds one it runs."""
    batch_id = new_batch_id()
    created = now()
    Batches(db).create(Batch(id=batch_id, org_id=org_id, key_id=key_id, endpoint="/v1/chat/completions",
                             input_file_id="file-x", input_blob_key="files/x", completion_window="24h",
                             priority="standard", status=BatchStatus.IN_PROGRESS, model="m", created_at=created,
                             expires_at=created + 86_400, total=1), now_ns(), [])
    claimed = BatchLeases(db).claim(worker, {"m": 100}, 60.0)
    assert claimed is not None and claimed.id == batch_id
    return batch_id


def _events(db: Database, batch_id: str) -> list[tuple[str, str]]:
    with db.read() as conn:
        return [tuple(r) for r in conn.execute(sa.select(webhook_events.c.id, webhook_events.c.type)
                                               .where(webhook_events.c.batch_id == batch_id)).all()]


def _finalize(db: Database, batch_id: str, org_id: str, worker: str = "w1",
              status: BatchStatus = BatchStatus.COMPLETED) -> None:
    Results(db).finalize(batch_id, worker, status=status, output=None, error=None, org_id=org_id, unrun=0)


def test_the_terminal_status_writes_its_event_and_a_delivery_per_live_endpoint(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStore(db)
    kept = [store.add_endpoint(org_id, f"https://h.example.com/{i}", "whsec_AAAA", limit=16) for i in range(2)]
    removed = store.add_endpoint(org_id, "https://h.example.com/gone", "whsec_AAAA", limit=16)
    assert removed is not None and all(kept)
    store.remove_endpoint(removed.id)
    batch_id = _running_batch(db, org_id, key_id)
    assert _events(db, batch_id) == []  # running: nothing to say yet

    _finalize(db, batch_id, org_id, status=BatchStatus.CANCELLED)
    [(event_id, event_type)] = _events(db, batch_id)
    assert event_type == "batch.cancelled"
    assert store.delivery_states(event_id) == {e.id: "pending" for e in kept if e is not None}
    with pytest.raises(LeaseLost):  # a finalizing again (a crashed worker's retry) finds the lease gone
        _finalize(db, batch_id, org_id)
    assert len(_events(db, batch_id)) == 1


def test_a_finalizing_that_fails_writes_no_event_and_an_event_that_fails_no_status(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    stolen = _running_batch(db, org_id, key_id, worker="w1")
    with pytest.raises(LeaseLost):  # another worker's finalizing: refused, and nothing of it is kept
        _finalize(db, stolen, org_id, worker="w2")
    assert _events(db, stolen) == []
    assert BatchLeases(db).by_id(stolen).status is BatchStatus.IN_PROGRESS

    # The other way round: an event that cannot be written (here its unique (batch, type) is taken) takes the
    # status down with it, because both are one transaction.
    with db.write() as conn:
        conn.execute(webhook_events.insert().values(id="evt_taken", org_id=org_id, type="batch.completed",
                                                    batch_id=stolen, created_at=now(), payload="{}"))
    with pytest.raises(StoreError):
        _finalize(db, stolen, org_id)
    batch = BatchLeases(db).by_id(stolen)
    assert batch.status is BatchStatus.IN_PROGRESS and batch.completed_at is None and batch.lease_owner == "w1"


def _due_deliveries(db: Database, count: int) -> tuple[WebhookStore, set[tuple[str, str]]]:
    org_id, key_id = _org_and_key(db)
    store = WebhookStore(db)
    endpoints = [store.add_endpoint(org_id, f"https://h.example.com/{i}", "whsec_AAAA", limit=16) for i in range(4)]
    for _ in range(count // 4):
        _finalize(db, _running_batch(db, org_id, key_id), org_id)
    with db.read() as conn:
        rows = conn.execute(sa.select(webhook_deliveries.c.event_id, webhook_deliveries.c.endpoint_id)).all()
    assert len(rows) == count and {r[1] for r in rows} == {e.id for e in endpoints if e is not None}
    return store, {tuple(r) for r in rows}


def test_many_loops_claiming_at_once_take_each_delivery_once(db: Database) -> None:
    store, expected = _due_deliveries(db, 40)
    taken: list[tuple[str, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def loop() -> None:
        start.wait()
        while claimed := store.claim_due(limit=3, hold_seconds=60):
            with lock:
                taken.extend((d.event_id, d.endpoint_id) for d in claimed)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(taken) == sorted(expected)  # every one, none twice
    assert store.claim_due(limit=100, hold_seconds=60) == []  # held: no loop takes them again meanwhile


def test_an_attempt_whose_claim_lapsed_changes_nothing_but_the_log(db: Database) -> None:
    store, _expected = _due_deliveries(db, 4)
    first = store.claim_due(limit=1, hold_seconds=0.0)[0]  # held for no time: due again at once
    again = [d for d in store.claim_due(limit=10, hold_seconds=60) if d.event_id == first.event_id
             and d.endpoint_id == first.endpoint_id][0]
    assert again.claim_token != first.claim_token and again.attempt == first.attempt == 1
    # The late loop's success is logged, but the delivery stays the new claim's.
    state = store.record_attempt(first, outcome="delivered", status_code=200, error=None, duration_ms=5,
                                 retry_in=1.0, give_up_after=86_400)
    assert state == "pending"
    assert store.record_attempt(again, outcome="failed", status_code=500, error="the endpoint answered 500",
                                duration_ms=5, retry_in=3600.0, give_up_after=86_400) == "pending"
    log = store.attempts(event_id=first.event_id, endpoint_id=first.endpoint_id)
    assert sorted((a.outcome, a.status_code) for a in log) == [("delivered", 200), ("failed", 500)]
    assert store.claim_due(limit=100, hold_seconds=60) == []  # retried in an hour, not before


def test_a_retry_past_the_give_up_window_ends_the_delivery(db: Database) -> None:
    store, _expected = _due_deliveries(db, 4)
    due = store.claim_due(limit=1, hold_seconds=60)[0]
    assert store.record_attempt(due, outcome="failed", status_code=None, error="ConnectError", duration_ms=1,
                                retry_in=10.0, give_up_after=5.0) == "failed"
    assert store.delivery_states(due.event_id)[due.endpoint_id] == "failed"
    assert all(d.endpoint_id != due.endpoint_id or d.event_id != due.event_id
               for d in store.claim_due(limit=100, hold_seconds=60))


def test_an_organization_cannot_pass_the_endpoint_limit(db: Database) -> None:
    org_id, _key_id = _org_and_key(db)
    store = WebhookStore(db)
    assert all(store.add_endpoint(org_id, f"https://h.example.com/{i}", "whsec_AAAA", limit=3) for i in range(3))
    assert store.add_endpoint(org_id, "https://h.example.com/x", "whsec_AAAA", limit=3) is None
    store.remove_endpoint(store.list_endpoints(org_id)[0].id)
    assert store.add_endpoint(org_id, "https://h.example.com/x", "whsec_AAAA", limit=3) is not None


# -- issue 25: event filters, rotation, replay, pruning ------------------------------------------------------------


def test_an_endpoint_gets_only_the_event_types_it_subscribes_to(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStore(db)
    every = store.add_endpoint(org_id, "https://h.example.com/all", "whsec_AAAA", limit=16)
    done = store.add_endpoint(org_id, "https://h.example.com/done", "whsec_AAAA", limit=16,
                              events=("batch.completed", "batch.failed"))
    assert every is not None and done is not None
    assert every.events is None and done.events == ("batch.completed", "batch.failed")
    assert store.endpoint(done.id).as_api()["events"] == ["batch.completed", "batch.failed"]
    assert every.as_api()["events"] == ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
    completed, cancelled = _running_batch(db, org_id, key_id), _running_batch(db, org_id, key_id)
    _finalize(db, completed, org_id)
    _finalize(db, cancelled, org_id, status=BatchStatus.CANCELLED)
    [(completed_event, _)] = _events(db, completed)
    [(cancelled_event, _)] = _events(db, cancelled)
    assert set(store.delivery_states(completed_event)) == {every.id, done.id}
    assert set(store.delivery_states(cancelled_event)) == {every.id}


def test_a_rotated_endpoint_is_signed_by_both_secrets_for_the_overlap_only(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStore(db)
    endpoint = store.add_endpoint(org_id, "https://h.example.com/r", "whsec_OLD", limit=16)
    assert endpoint is not None
    _finalize(db, _running_batch(db, org_id, key_id), org_id)
    [before] = store.claim_due(limit=10, hold_seconds=0.0, rotation_overlap=3600)
    assert before.signing_secrets == ["whsec_OLD"]  # never rotated: one secret

    rotated = store.rotate_secret(endpoint.id, "whsec_NEW")
    assert rotated.rotated_at is not None
    [during] = store.claim_due(limit=10, hold_seconds=0.0, rotation_overlap=3600)
    assert during.signing_secrets == ["whsec_NEW", "whsec_OLD"]
    [after] = store.claim_due(limit=10, hold_seconds=0.0, rotation_overlap=0)  # the overlap is over
    assert after.signing_secrets == ["whsec_NEW"]

    store.rotate_secret(endpoint.id, "whsec_NEWER")  # a rotation during the overlap ends the oldest secret's
    [again] = store.claim_due(limit=10, hold_seconds=60, rotation_overlap=3600)
    assert again.signing_secrets == ["whsec_NEWER", "whsec_NEW"]
    other_org, _ = _org_and_key(db)
    with pytest.raises(NotFound):
        store.rotate_secret(endpoint.id, "whsec_X", other_org)


def test_a_replay_makes_any_delivery_due_again_as_a_new_attempt(db: Database) -> None:
    store, _expected = _due_deliveries(db, 4)
    delivered, given_up, *_ = store.claim_due(limit=10, hold_seconds=60)
    store.record_attempt(delivered, outcome="delivered", status_code=200, error=None, duration_ms=1, retry_in=1.0,
                         give_up_after=86_400)
    store.record_attempt(given_up, outcome="failed", status_code=500, error="x", duration_ms=1, retry_in=None,
                         give_up_after=86_400)
    assert store.claim_due(limit=10, hold_seconds=60) == []  # the other two are still held
    for done, was in ((delivered, "delivered"), (given_up, "failed")):
        replayed = store.replay_delivery(done.delivery_id)
        assert (replayed.event_id, replayed.endpoint_id, replayed.previous_state) == (done.event_id,
                                                                                      done.endpoint_id, was)
        assert replayed.as_api()["state"] == "pending" and replayed.attempts == 1
    again = {(d.event_id, d.endpoint_id): d for d in store.claim_due(limit=10, hold_seconds=60)}
    assert set(again) == {(delivered.event_id, delivered.endpoint_id), (given_up.event_id, given_up.endpoint_id)}
    assert all(d.attempt == 2 for d in again.values())  # a new attempt of the same event
    with pytest.raises(NotFound):
        store.replay_delivery("whd_nope")
    with pytest.raises(NotFound):
        store.replay_delivery(delivered.delivery_id, org_id="org_other")
    store.remove_endpoint(delivered.endpoint_id)
    with pytest.raises(Conflict) as refused:
        store.replay_delivery(delivered.delivery_id)
    assert refused.value.code == "webhook_endpoint_removed"


def test_pruning_deletes_the_old_log_of_finished_deliveries_only(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStore(db)
    endpoint = store.add_endpoint(org_id, "https://h.example.com/p", "whsec_AAAA", limit=16)
    second = store.add_endpoint(org_id, "https://h.example.com/q", "whsec_AAAA", limit=16)
    assert endpoint is not None and second is not None
    finished, retrying = _running_batch(db, org_id, key_id), _running_batch(db, org_id, key_id)
    _finalize(db, finished, org_id)
    _finalize(db, retrying, org_id, status=BatchStatus.CANCELLED)
    [(finished_event, _)], [(retrying_event, _)] = _events(db, finished), _events(db, retrying)
    for due in store.claim_due(limit=10, hold_seconds=60):
        if due.event_id == retrying_event and due.endpoint_id == endpoint.id:  # still being retried
            store.record_attempt(due, outcome="failed", status_code=503, error="x", duration_ms=1, retry_in=3600.0,
                                 give_up_after=86_400)
        else:
            store.record_attempt(due, outcome="delivered", status_code=200, error=None, duration_ms=1,
                                 retry_in=1.0, give_up_after=86_400)
    [finished_delivery] = [a.delivery_id for a in store.attempts(event_id=finished_event, endpoint_id=endpoint.id)]
    assert store.prune_delivery_log(older_than=3600) == PrunedLog(attempts=0, deliveries=0, events=0)  # too young
    assert len(store.attempts(org_id=org_id)) == 4

    # One delivery per transaction: every finished one goes, with its attempts; the event of the retrying one stays.
    pruned = store.prune_delivery_log(older_than=0, rows_per_transaction=1)
    assert pruned == PrunedLog(attempts=3, deliveries=3, events=1)
    assert [(a.event_id, a.endpoint_id) for a in store.attempts(org_id=org_id)] == [(retrying_event, endpoint.id)]
    assert _events(db, finished) == [] and store.delivery_states(retrying_event) == {endpoint.id: "pending"}
    with pytest.raises(NotFound):
        store.replay_delivery(finished_delivery)
    assert store.prune_delivery_log(older_than=0) == PrunedLog(attempts=0, deliveries=0, events=0)
