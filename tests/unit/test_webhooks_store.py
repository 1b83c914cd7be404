"""The webhook outbox on a real store (SQLite in a temp dir, or a fresh PostgreSQL database): the event is
written by the transaction that writes the terminal status and by no other; deliveries are claimed by one loop
at a time however many claim at once; an attempt's outcome is fenced by its claim; giving up; event filters,
secret rotation, replays and pruning the log."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from openrelay.backoff import Backoff
from openrelay.clock import now, now_ns
from openrelay.errors import Conflict, NotFound, StoreError
from openrelay.ids import new_batch_id
from openrelay.store.accounts import Accounts
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.leases import BatchLeases
from openrelay.store.results import LeaseLost, Results
from openrelay.store.retention import Retention
from openrelay.store.schema import webhook_deliveries, webhook_events
from openrelay.store.webhook_log import PrunedLog
from openrelay.store.webhook_outbox import DueDelivery
from openrelay.types import Batch, BatchStatus
from tests.support.store_rows import fresh_database
from tests.support.webhook_loops import WebhookStores

HOUR = Backoff(base=3600.0, cap=3600.0)  # a failed delivery, and its endpoint, wait an hour: past any test
ANY = 1000  # attempts in flight to one endpoint: as many as asked


def claimed(store: WebhookStores, *, hold_seconds: float = 60.0, endpoint_concurrency: int = ANY,
            rotation_overlap: float = 0.0) -> list[DueDelivery]:
    """Every delivery the claims of one loop take now, claim after claim."""
    taken: list[DueDelivery] = []
    while found := store.outbox.claim_due(limit=100, hold_seconds=hold_seconds,
                                          endpoint_concurrency=endpoint_concurrency,
                                          rotation_overlap=rotation_overlap):
        taken += found
        if hold_seconds == 0:  # due again at once: once is all
            break
    return taken


def record(store: WebhookStores, due: DueDelivery, outcome: str, *, backoff: Backoff = HOUR,
           give_up_after: float = 86_400, retry: bool = True) -> str:
    return store.outbox.record_attempt(due, outcome=outcome, status_code=200 if outcome == "delivered" else 503,
                                error=None if outcome == "delivered" else "x", duration_ms=1, backoff=backoff,
                                give_up_after=give_up_after, retry=retry)


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
    if status is BatchStatus.CANCELLED:  # only a cancelling batch ends cancelled (openrelay/lifecycle.py)
        Batches(db).request_cancel(org_id, batch_id)
    Results(db).finalize(batch_id, worker, status=status, output=None, error=None, org_id=org_id, unrun=0)


def test_the_terminal_status_writes_its_event_and_a_delivery_per_live_endpoint(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStores.of(db)
    kept = [store.endpoints.add_endpoint(org_id, f"https://h.example.com/{i}", "whsec_AAAA", limit=16)
            for i in range(2)]
    removed = store.endpoints.add_endpoint(org_id, "https://h.example.com/gone", "whsec_AAAA", limit=16)
    assert removed is not None and all(kept)
    store.endpoints.remove_endpoint(removed.id)
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


def _due_deliveries(db: Database, count: int) -> tuple[WebhookStores, set[tuple[str, str]]]:
    org_id, key_id = _org_and_key(db)
    store = WebhookStores.of(db)
    endpoints = [store.endpoints.add_endpoint(org_id, f"https://h.example.com/{i}", "whsec_AAAA", limit=16)
                 for i in range(4)]
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
        while found := store.outbox.claim_due(limit=3, hold_seconds=60, endpoint_concurrency=ANY):
            with lock:
                taken.extend((d.event_id, d.endpoint_id) for d in found)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(taken) == sorted(expected)  # every one, none twice
    assert claimed(store) == []  # held: no loop takes them again meanwhile


def test_an_attempt_whose_claim_lapsed_changes_nothing_but_the_log(db: Database) -> None:
    store, _expected = _due_deliveries(db, 4)
    # Held for no time: due again.
    first = store.outbox.claim_due(limit=1, hold_seconds=0.0, endpoint_concurrency=ANY)[0]
    again = [d for d in claimed(store) if d.event_id == first.event_id
             and d.endpoint_id == first.endpoint_id][0]
    assert again.claim_token != first.claim_token and again.attempt == first.attempt == 1
    # The late loop's success is logged, but the delivery stays the new claim's.
    assert record(store, first, "delivered") == "pending"
    assert record(store, again, "failed") == "pending"
    log = store.log.attempts(event_id=first.event_id, endpoint_id=first.endpoint_id)
    assert sorted((a.outcome, a.status_code) for a in log) == [("delivered", 200), ("failed", 503)]
    assert claimed(store) == []  # retried in an hour, not before


def test_a_retry_past_the_give_up_window_ends_the_delivery(db: Database) -> None:
    store, _expected = _due_deliveries(db, 4)
    due = claimed(store)[0]
    assert record(store, due, "failed", backoff=Backoff(base=10.0, cap=10.0), give_up_after=5.0) == "failed"
    assert store.delivery_states(due.event_id)[due.endpoint_id] == "failed"
    assert all(d.endpoint_id != due.endpoint_id or d.event_id != due.event_id for d in claimed(store))


def test_an_organization_cannot_pass_the_endpoint_limit(db: Database) -> None:
    org_id, _key_id = _org_and_key(db)
    store = WebhookStores.of(db)
    assert all(store.endpoints.add_endpoint(org_id, f"https://h.example.com/{i}", "whsec_AAAA", limit=3)
               for i in range(3))
    assert store.endpoints.add_endpoint(org_id, "https://h.example.com/x", "whsec_AAAA", limit=3) is None
    store.endpoints.remove_endpoint(store.endpoints.list_endpoints(org_id)[0].id)
    assert store.endpoints.add_endpoint(org_id, "https://h.example.com/x", "whsec_AAAA", limit=3) is not None


# -- issue 25: event filters, rotation, replay, pruning ------------------------------------------------------------


def test_an_endpoint_gets_only_the_event_types_it_subscribes_to(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStores.of(db)
    every = store.endpoints.add_endpoint(org_id, "https://h.example.com/all", "whsec_AAAA", limit=16)
    done = store.endpoints.add_endpoint(org_id, "https://h.example.com/done", "whsec_AAAA", limit=16,
                              events=("batch.completed", "batch.failed"))
    assert every is not None and done is not None
    assert every.events is None and done.events == ("batch.completed", "batch.failed")
    assert store.endpoints.endpoint(done.id).as_api()["events"] == ["batch.completed", "batch.failed"]
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
    store = WebhookStores.of(db)
    endpoint = store.endpoints.add_endpoint(org_id, "https://h.example.com/r", "whsec_OLD", limit=16)
    assert endpoint is not None
    _finalize(db, _running_batch(db, org_id, key_id), org_id)
    [before] = claimed(store, hold_seconds=0.0, rotation_overlap=3600)
    assert before.signing_secrets == ["whsec_OLD"]  # never rotated: one secret

    rotated = store.endpoints.rotate_secret(endpoint.id, "whsec_NEW")
    assert rotated.rotated_at is not None
    [during] = claimed(store, hold_seconds=0.0, rotation_overlap=3600)
    assert during.signing_secrets == ["whsec_NEW", "whsec_OLD"]
    [after] = claimed(store, hold_seconds=0.0, rotation_overlap=0)  # the overlap is over
    assert after.signing_secrets == ["whsec_NEW"]

    store.endpoints.rotate_secret(endpoint.id, "whsec_NEWER")  # a rotation during the overlap ends the oldest secret's
    [again] = claimed(store, rotation_overlap=3600)
    assert again.signing_secrets == ["whsec_NEWER", "whsec_NEW"]
    other_org, _ = _org_and_key(db)
    with pytest.raises(NotFound):
        store.endpoints.rotate_secret(endpoint.id, "whsec_X", other_org)


def test_a_replay_makes_any_delivery_due_again_as_a_new_attempt(db: Database) -> None:
    store, _expected = _due_deliveries(db, 4)
    delivered, given_up, *_ = claimed(store)
    record(store, delivered, "delivered")
    record(store, given_up, "failed", retry=False)
    assert claimed(store) == []  # the other two are still held
    for done, was in ((delivered, "delivered"), (given_up, "failed")):
        replayed = store.log.replay_delivery(done.delivery_id)
        assert (replayed.event_id, replayed.endpoint_id, replayed.previous_state) == (done.event_id,
                                                                                      done.endpoint_id, was)
        assert replayed.as_api()["state"] == "pending" and replayed.attempts == 1
    again = {(d.event_id, d.endpoint_id): d for d in claimed(store)}
    assert set(again) == {(delivered.event_id, delivered.endpoint_id), (given_up.event_id, given_up.endpoint_id)}
    assert all(d.attempt == 2 for d in again.values())  # a new attempt of the same event
    with pytest.raises(NotFound):
        store.log.replay_delivery("whd_nope")
    with pytest.raises(NotFound):
        store.log.replay_delivery(delivered.delivery_id, org_id="org_other")
    store.endpoints.remove_endpoint(delivered.endpoint_id)
    with pytest.raises(Conflict) as refused:
        store.log.replay_delivery(delivered.delivery_id)
    assert refused.value.code == "webhook_endpoint_removed"


def test_pruning_deletes_the_old_log_of_finished_deliveries_only(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    store = WebhookStores.of(db)
    endpoint = store.endpoints.add_endpoint(org_id, "https://h.example.com/p", "whsec_AAAA", limit=16)
    second = store.endpoints.add_endpoint(org_id, "https://h.example.com/q", "whsec_AAAA", limit=16)
    assert endpoint is not None and second is not None
    finished, retrying = _running_batch(db, org_id, key_id), _running_batch(db, org_id, key_id)
    _finalize(db, finished, org_id)
    _finalize(db, retrying, org_id, status=BatchStatus.CANCELLED)
    [(finished_event, _)], [(retrying_event, _)] = _events(db, finished), _events(db, retrying)
    for due in claimed(store):
        retrying_one = due.event_id == retrying_event and due.endpoint_id == endpoint.id  # still being retried
        record(store, due, "failed" if retrying_one else "delivered")
    [finished_delivery] = [a.delivery_id for a in store.log.attempts(event_id=finished_event, endpoint_id=endpoint.id)]
    assert store.log.prune_delivery_log(older_than=3600) == PrunedLog(attempts=0, deliveries=0, events=0)  # too young
    assert len(store.log.attempts(org_id=org_id)) == 4

    # One delivery per transaction: every finished one goes, with its attempts; the event of the retrying one stays.
    pruned = store.log.prune_delivery_log(older_than=0, rows_per_transaction=1)
    assert pruned == PrunedLog(attempts=3, deliveries=3, events=1)
    assert [(a.event_id, a.endpoint_id) for a in store.log.attempts(org_id=org_id)] == [(retrying_event, endpoint.id)]
    assert _events(db, finished) == [] and store.delivery_states(retrying_event) == {endpoint.id: "pending"}
    with pytest.raises(NotFound):
        store.log.replay_delivery(finished_delivery)
    assert store.log.prune_delivery_log(older_than=0) == PrunedLog(attempts=0, deliveries=0, events=0)


# -- issue 34: each endpoint's concurrency and circuit; retention keeps what a delivery still owes -----------------


def _endpoint_with_deliveries(db: Database, name: str, count: int, org: tuple[str, str] | None = None,
                              ) -> tuple[WebhookStores, str]:
    """An endpoint (of a new organization, unless ``org``) and ``count`` ended batches of its organization."""
    org_id, key_id = org or _org_and_key(db)
    store = WebhookStores.of(db)
    endpoint = store.endpoints.add_endpoint(org_id, f"https://h.example.com/{name}", "whsec_AAAA", limit=16)
    assert endpoint is not None
    for _ in range(count):
        _finalize(db, _running_batch(db, org_id, key_id), org_id)
    return store, endpoint.id


def test_an_endpoint_has_at_most_its_concurrency_and_the_least_busy_goes_first(db: Database) -> None:
    org = _org_and_key(db)
    store, busy = _endpoint_with_deliveries(db, "busy", 6, org)
    first = store.outbox.claim_due(limit=10, hold_seconds=60, endpoint_concurrency=4)
    assert [d.endpoint_id for d in first] == [busy] * 4 and claimed(store, endpoint_concurrency=4) == []
    _store, quiet = _endpoint_with_deliveries(db, "quiet", 2, org)  # two more events: to busy too, and to quiet
    # Quiet's deliveries are the newest due, but nothing of quiet is in flight: they go in turns with busy's
    # backlog, quiet first.
    taken = store.outbox.claim_due(limit=3, hold_seconds=60, endpoint_concurrency=8)
    assert [d.endpoint_id for d in taken] == [quiet, quiet, busy]
    assert claimed(store, endpoint_concurrency=5) == []  # busy has five in flight, and three more due
    record(store, first[0], "delivered")
    assert [d.endpoint_id for d in claimed(store, endpoint_concurrency=5)] == [busy]


def test_a_failing_endpoint_is_paused_then_probed_one_attempt_at_a_time(db: Database) -> None:
    org = _org_and_key(db)
    store, bad = _endpoint_with_deliveries(db, "bad", 0, org)
    _store, good = _endpoint_with_deliveries(db, "good", 3, org)
    first = {d.endpoint_id: d for d in store.outbox.claim_due(limit=10, hold_seconds=60, endpoint_concurrency=1)}
    assert set(first) == {bad, good}
    assert record(store, first[bad], "failed") == "pending"  # retried in an hour; its endpoint paused as long
    # Bad's other deliveries are due, but wait for its pause; good's go on.
    assert [d.endpoint_id for d in claimed(store, endpoint_concurrency=4)] == [good, good]
    waiting = [v for v in store.log.list_deliveries(bad, limit=10)[0] if v.state == "pending"]
    assert len(waiting) == 3 and all(v.next_attempt_at and v.next_attempt_at > now() + 3000 for v in waiting)

    # A pause that ends at once: the endpoint is still failing, so one attempt at a time until one is delivered.
    store, flaky = _endpoint_with_deliveries(db, "flaky", 3)
    [one] = store.outbox.claim_due(limit=10, hold_seconds=60, endpoint_concurrency=1)
    record(store, one, "failed", backoff=Backoff(base=0.0, cap=3600.0))
    [probe] = store.outbox.claim_due(limit=10, hold_seconds=60, endpoint_concurrency=4)
    assert probe.endpoint_id == flaky and claimed(store, endpoint_concurrency=4) == []
    assert record(store, probe, "delivered") == "delivered"
    assert [d.endpoint_id for d in claimed(store, endpoint_concurrency=4)] == [flaky, flaky]  # closed: four again

    # A pause past the end of the deliveries' window gives up those waiting, as their own failure would.
    store, dead = _endpoint_with_deliveries(db, "dead", 3)
    [one] = claimed(store, endpoint_concurrency=1)
    assert record(store, one, "failed", give_up_after=60.0) == "failed"
    assert {v.state for v in store.log.list_deliveries(dead, limit=10)[0]} == {"failed"}


def test_retention_keeps_a_batch_whose_webhook_is_still_owed(db: Database) -> None:
    org_id, key_id = _org_and_key(db)
    plain = _running_batch(db, org_id, key_id)
    _finalize(db, plain, org_id)  # no endpoint yet: nothing owed
    store, endpoint = _endpoint_with_deliveries(db, "owed", 0, (org_id, key_id))
    owed = _running_batch(db, org_id, key_id)
    _finalize(db, owed, org_id)
    retention = Retention(db)
    assert retention.ended_batches(older_than_days=0, limit=100, dry_run=True).rows == 1
    assert retention.ended_batches(older_than_days=0, limit=100).rows == 1
    with pytest.raises(NotFound):
        BatchLeases(db).by_id(plain)
    [(event_id, _)] = _events(db, owed)
    assert BatchLeases(db).by_id(owed).status is BatchStatus.COMPLETED

    [due] = claimed(store)
    assert record(store, due, "failed") == "pending"  # being retried: still owed, still kept
    assert retention.ended_batches(older_than_days=0, limit=100).rows == 0
    assert store.delivery_states(event_id) == {endpoint: "pending"}

    store.log.replay_delivery(due.delivery_id)  # sent again now, and delivered: nothing is owed any more
    [again] = claimed(store)
    assert record(store, again, "delivered") == "delivered"
    assert retention.ended_batches(older_than_days=0, limit=100).rows == 1
    assert _events(db, owed) == []
