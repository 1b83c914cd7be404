"""Change notices on PostgreSQL (store/notices.py): the process that writes notifies each organization whose polls
its commit changes, after the commit, coalesced per organization (or batch) per openrelay.notice_seconds; a lease's
renewal sends none; openrelay.notices = 'off' sends none; migration 0021 drops the triggers that sent them before.
On a fresh database of the test server, through the store's own write functions; a LISTEN connection hears."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from openrelay.store.accounts import Accounts
from openrelay.store.batches import Batches
from openrelay.store.db import BACKFILLS, Database
from openrelay.store.notice_triggers import drop_change_triggers
from openrelay.store.notices import CHANNEL, SPACING_SETTING, announce
from openrelay.store.results import Chunk, Results
from tests.support.server import PG_ADMIN_URL, create_pg_database, drop_pg_database
from tests.support.store_rows import insert_running_batch

MARKER = " marker"  # no organization id holds a space


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database; parametrized indirectly, its openrelay.notice_seconds."""
    url = create_pg_database()
    spacing = getattr(request, "param", None)
    if spacing is not None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET {SPACING_SETTING} = '{spacing}'")
    try:
        yield url
    finally:
        drop_pg_database(url)


def _store(url: str) -> tuple[Database, str, str]:
    """(the store, an organization, its batch 'b1' held by worker 'w')."""
    db = Database(url)
    db.migrate()
    accounts = Accounts(db)
    org = accounts.create_org("notices")
    key, _ = accounts.create_key(org.id)
    with db.write() as conn:
        insert_running_batch(conn, batch_id="b1", org_id=org.id, key_id=key.id, lease_owner="w")
    return db, org.id, key.id


def _until_marker(listener: psycopg.Connection, writer: psycopg.Connection) -> list[str]:
    """The notices heard up to a marker sent now (notices arrive in commit order)."""
    writer.execute("SELECT pg_notify(%s, %s)", (CHANNEL, MARKER))
    heard = []
    for notice in listener.notifies(timeout=10):
        if notice.payload == MARKER:
            return heard
        heard.append(notice.payload)
    raise AssertionError(f"no marker within 10 s: {heard}")


@pytest.mark.parametrize("pg_url", ["0"], indirect=True)  # nothing coalesced: one notice per change
def test_each_write_a_poll_can_show_notifies_its_organization_after_its_commit_and_no_heartbeat(pg_url) -> None:
    db, org_id, key_id = _store(pg_url)
    batches, results = Batches(db), Results(db)
    try:
        with psycopg.connect(pg_url, autocommit=True) as listener, psycopg.connect(pg_url, autocommit=True) as w:
            listener.execute(f"LISTEN {CHANNEL}")
            # Each write names what it changed; the notifier sends it once the commit is done, so a notice never
            # arrives before what it announces can be read.
            for write in (lambda: batches.set_metadata(org_id, "b1", {"n": "1"}),
                          lambda: batches.set_concurrency_limit("b1", "w", 3),  # the organization looked up
                          lambda: results.commit_chunk("b1", "w", key_id, Chunk(
                              seq=0, out_key="o", err_key=None, lines=[0], completed=1, failed=0, input_tokens=1,
                              output_tokens=1, cost_nano_usd=0))):
                before = w.execute("SELECT to_jsonb(batches) FROM batches WHERE id = 'b1'").fetchone()
                write()
                notice = next(listener.notifies(timeout=10, stop_after=1))
                assert notice.payload == org_id
                assert w.execute("SELECT to_jsonb(batches) FROM batches WHERE id = 'b1'").fetchone() != before

            # A lease's renewal (each running batch's heartbeat) and a write that changes nothing send none; nor
            # does a commit that failed.
            assert batches.renew_lease("b1", "w", 30) is not None
            batches.set_concurrency_limit("b1", "w", 3)  # unchanged: no row written
            batches.release("b1", "someone else")
            with pytest.raises(ZeroDivisionError), db.write() as conn:
                assert conn.execute(sa.text("UPDATE batches SET metadata = '{}' WHERE id = 'b1'")).rowcount == 1
                announce(conn, org_id=org_id)
                raise ZeroDivisionError  # the transaction rolls back
            db.notifier.close()  # sends whatever is waiting, now
            assert _until_marker(listener, w) == []
    finally:
        db.dispose()


@pytest.mark.parametrize("pg_url", ["2"], indirect=True)
def test_an_organizations_changes_are_coalesced_and_the_last_one_is_always_notified(pg_url) -> None:
    """openrelay.notice_seconds 2: the first change notifies at once, the changes within 2 s of a notice wait for
    the end of those 2 s and go in one notice. However fast the machine, there are at most 2 + (elapsed / 2)
    notices, and the last one is sent after the last commit: it reads every change."""
    db, org_id, _ = _store(pg_url)
    batches = Batches(db)
    try:
        with psycopg.connect(pg_url, autocommit=True) as listener, psycopg.connect(pg_url, autocommit=True) as w:
            listener.execute(f"LISTEN {CHANNEL}")
            began = time.monotonic()
            batches.set_metadata(org_id, "b1", {"n": "0"})
            assert next(listener.notifies(timeout=10, stop_after=1)).payload == org_id
            for n in range(1, 12):  # after a notice: these wait for the end of its spacing
                batches.set_metadata(org_id, "b1", {"n": str(n)})
            elapsed = time.monotonic() - began
            seen = []  # what each notice's organization shows when the notice arrives
            for notice in listener.notifies(timeout=6):  # past the spacing: every notice has come
                assert notice.payload == org_id
                seen.append(w.execute("SELECT metadata FROM batches WHERE id = 'b1'").fetchone()[0])
            assert 1 <= len(seen) <= 1 + elapsed / 2, (seen, elapsed)
            assert seen[-1] == '{"n":"11"}'
    finally:
        db.dispose()


def test_a_database_with_notices_off_gets_none(pg_url) -> None:
    """``ALTER DATABASE ... SET openrelay.notices = 'off'``: the notifier reads it when it connects and sends
    nothing (the API's listeners read it too, and keep nothing: test_read_cache.py)."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{pg_url.rsplit('/', 1)[1]}\" SET openrelay.notices = 'off'")
    db, org_id, _ = _store(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as listener, psycopg.connect(pg_url, autocommit=True) as w:
            listener.execute(f"LISTEN {CHANNEL}")
            Batches(db).set_metadata(org_id, "b1", {"n": "1"})
            db.notifier.close()
            assert _until_marker(listener, w) == []
    finally:
        db.dispose()


def test_migration_0021_drops_the_triggers_and_their_table_from_a_store_made_before(pg_url) -> None:
    """A store migrated before: the triggers of 0010 and 0015 sent a notice from inside each commit and wrote
    org_notices. After 0021 a commit sends nothing by itself, and the store's writes notify after it."""
    version = next(v for v, hook in BACKFILLS.items() if hook is drop_change_triggers)
    db = Database(pg_url)
    try:
        db.migrate(upto=version - 1)

        def triggers() -> list[str]:
            with db.read() as conn:
                return sorted(conn.execute(sa.text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")).scalars())

        def leftovers() -> list[object]:
            with db.read() as conn:
                return list(conn.execute(sa.text(
                    "SELECT to_regclass('org_notices') UNION ALL "
                    "SELECT oid FROM pg_proc WHERE proname LIKE 'openrelay_announce%'")).scalars())

        assert triggers() == ["batch_tags_announce", "batches_announce", "batches_announce_update"]
        assert len([x for x in leftovers() if x is not None]) == 3
        assert version in db.migrate()
        assert triggers() == []
        assert [x for x in leftovers() if x is not None] == []
    finally:
        db.dispose()
