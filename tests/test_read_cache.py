"""The API's read cache (store/read_cache.py): polls reuse the rows they read while nothing changed, and a change
shows in the next polls wherever it was made: in this process (at once), in another process on the same database
(on PostgreSQL within the notice's delivery; on SQLite by the file's data_version), on PostgreSQL with the
cache's listening connection cut (the cache stands aside until it listens again, then is used again), and on
PostgreSQL when no notice ever comes (its writer killed first, or a tool's write: kept rows age out).

Two `orl serve` processes share a database of the test's own, on each store whatever store the suite runs on:
the two stores keep rows by different means, and each is tested on its own."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from openrelay.errors import StoreError
from openrelay.store import compiled
from openrelay.store.accounts import Accounts
from openrelay.store.compiled import CompiledRead, FirstRow, run_plan
from openrelay.store.db import Database
from openrelay.store.notices import CHANNEL, SPACING_SETTING
from openrelay.store.read_cache import KEEP_SECONDS, KeptRows, ReadCache
from openrelay.store.schema import organizations
from tests.support import http_client
from tests.support.batches import chat, create, wait_for
from tests.support.server import PG_ADMIN_URL, TEST_CATALOG, Server, create_pg_database, drop_pg_database, free_port


def _pair(tmp_path_factory: pytest.TempPathFactory, engine_url: str, store: str,
          notice_seconds: str | None = None) -> Iterator[tuple[Server, Server, str]]:
    """(A, B, database name): two API processes on one database (A runs the worker), and a key both take.
    ``notice_seconds``: the database's openrelay.notice_seconds, set before either starts."""
    if store == "postgres":
        url = create_pg_database()
        if notice_seconds is not None:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET {SPACING_SETTING} = "
                              f"'{notice_seconds}'")
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('cache-db') / 'openrelay.db'}"
    started: list[Server] = []
    try:
        for name in ("a", "b"):
            data_dir = tmp_path_factory.mktemp(f"cache-{name}")
            catalog = data_dir / "catalog.toml"
            catalog.write_text(TEST_CATALOG.format(engine=engine_url, slots=2, concurrency=8))
            server = Server(data_dir=data_dir, database_url=url, port=free_port(), env={},
                            args=["--catalog", str(catalog), *(["--no-worker"] if name == "b" else [])])
            started.append(server.start())
        a, b = started
        a.api_key = b.api_key = a.new_org_key()
        yield a, b, url.rsplit("/", 1)[1]
    finally:
        for server in started:
            server.stop()
        if store == "postgres":
            drop_pg_database(url)


@pytest.fixture(params=["postgres", "sqlite"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         engine_url: str) -> Iterator[tuple[Server, Server, str]]:
    yield from _pair(tmp_path_factory, engine_url, request.param)


@pytest.fixture
def pg_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            engine_url: str) -> Iterator[tuple[Server, Server, str]]:
    """Parametrized indirectly, the database's openrelay.notice_seconds."""
    yield from _pair(tmp_path_factory, engine_url, "postgres", getattr(request, "param", None))


def _poll_reads(server: Server) -> dict[str, float]:
    text = http_client.get(f"http://127.0.0.1:{server.port}/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r'openrelay_poll_reads_total\{source="(\w+)"\} (\S+)', text)}


def _metadata(server: Server, batch_id: str) -> dict[str, str]:
    response = server.http("GET", f"/batches/{batch_id}")
    assert response.status_code == 200, response.text
    return response.json()["metadata"]


def _edit(server: Server, batch_id: str, metadata: dict[str, str]) -> None:
    response = server.http("POST", f"/batches/{batch_id}/metadata", json={"metadata": metadata})
    assert response.status_code == 200, response.text


def _listening(server: Server) -> bool:
    """Whether ``server``'s cache is in use: two polls in a row, the second answered from kept rows."""
    before = _poll_reads(server).get("kept", 0)
    for _ in range(2):
        server.http("GET", "/batches", params={"limit": 5})
    return _poll_reads(server).get("kept", 0) > before


def test_polls_reuse_kept_rows_and_see_each_change_wherever_it_was_made(pair: tuple[Server, Server, str]) -> None:
    a, b, _ = pair
    batch_id = create(a, [chat("one", "hello")])["id"]
    a.wait(batch_id)  # nothing changes it from here but the edits below
    wait_for(lambda: _listening(a), "A's cache listening", timeout=30)

    # Polls of a batch nothing changes are answered from kept rows (on PostgreSQL read again once per
    # KEEP_SECONDS, however slow the polls).
    before, began = _poll_reads(a), time.monotonic()
    for _ in range(20):
        assert a.http("GET", f"/batches/{batch_id}").status_code == 200
    after, elapsed = _poll_reads(a), time.monotonic() - began
    assert after["kept"] - before.get("kept", 0) >= 15 - elapsed / KEEP_SECONDS, (before, after, elapsed)

    # A's own edit shows in A's very next poll, every time (its commit forgets what A kept).
    for n in range(10):
        _edit(a, batch_id, {"round": f"a{n}"})
        assert _metadata(a, batch_id) == {"round": f"a{n}"}

    # Another process's edit shows in A's polls once PostgreSQL's notice reaches A; a page shows it too.
    for n in range(5):
        assert _metadata(a, batch_id)["round"] != f"b{n}"  # kept again since the last change
        _edit(b, batch_id, {"round": f"b{n}"})
        wait_for(lambda n=n: _metadata(a, batch_id) == {"round": f"b{n}"}, f"B's edit {n} seen by A", timeout=10)
        wait_for(lambda n=n: a.http("GET", "/batches").json()["data"][0]["metadata"] == {"round": f"b{n}"},
                 f"B's edit {n} on A's page", timeout=10)

    # A batch made by B appears on A's page, though A had kept the page without it.
    first = a.http("GET", "/batches").json()["data"]
    made = create(b, [chat("two", "hello again")])["id"]
    wait_for(lambda: a.http("GET", "/batches").json()["data"][0]["id"] == made, "B's batch on A's page", timeout=10)
    assert [row["id"] for row in first] == [batch_id]


def test_a_cut_listener_stands_the_cache_aside_until_it_listens_again(pg_pair: tuple[Server, Server, str]) -> None:
    a, b, database = pg_pair
    batch_id = create(a, [chat("one", "hello")])["id"]
    a.wait(batch_id)
    wait_for(lambda: _listening(a), "A's cache listening", timeout=30)
    assert not _metadata(a, batch_id)  # none yet, and kept so

    # Cut A's listener and keep it from coming back (no new connection to the database is let in), then change
    # the batch from a connection opened before: its notice reaches nobody. A's polls, on the pool's open
    # connections, must read the server until A listens again.
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database
    with psycopg.connect(url, autocommit=True) as writer, psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            cut = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                "AND application_name = 'openrelay-read-cache'", (database,)).fetchall()
            assert cut == [(True,)], cut  # A's listener (B's starts with its first poll: it has made none)
            writer.execute("UPDATE batches SET metadata = %s WHERE id = %s", ('{"after": "cut"}', batch_id))
            wait_for(lambda: _metadata(a, batch_id) == {"after": "cut"}, "the change seen by A after the cut",
                     timeout=10)
            assert not _listening(a)
        finally:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')

    # The listener comes back on its own, and the cache with it; changes still show.
    wait_for(lambda: _listening(a), "A's cache listening again", timeout=30)
    _edit(b, batch_id, {"after": "return"})
    wait_for(lambda: _metadata(a, batch_id) == {"after": "return"}, "B's edit seen by A after the return",
             timeout=10)


def test_the_cache_can_be_turned_off(make_server) -> None:
    """``OPENRELAY_POLL_CACHE=0`` (behind a pooler that does not carry LISTEN): every poll reads the store."""
    server = make_server(env={"OPENRELAY_POLL_CACHE": "0"})
    batch_id = create(server, [chat("one", "hello")])["id"]
    for _ in range(20):
        assert server.http("GET", f"/batches/{batch_id}").status_code == 200
    reads = _poll_reads(server)
    assert reads.get("kept", 0) == 0, reads  # with the cache on, 19 of the 20 (tests above)


def test_postgresql_a_run_in_another_process_notifies_and_notices_off_keep_nothing(
        pg_pair: tuple[Server, Server, str]) -> None:
    """A worker's writes (the batch's creation, claim, chunk commits, end) notify its organization after each
    commit (store/notices.py; which write sends what: test_notices.py). An operator may turn the notices off for
    the database; the API's caches then keep nothing."""
    a, b, database = pg_pair
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as writer:
        listener.execute(f"LISTEN {CHANNEL}")
        batch_id = create(a, [chat("one", "hello")])["id"]
        a.wait(batch_id)
        org_id = writer.execute("SELECT org_id FROM batches WHERE id = %s", (batch_id,)).fetchone()[0]
        assert org_id in {n.payload for n in listener.notifies(timeout=1)}
        writer.execute(f'ALTER DATABASE "{database}" SET openrelay.notices = \'off\'')
    b.api_key = b.new_org_key()  # B has not polled yet: its listener starts with this poll, under the setting
    assert not _listening(b)
    wait_for(lambda: "openrelay.notices is off" in b.log(), "B's listener to read the setting", timeout=30)
    assert not _listening(b)  # it has decided: nothing is kept


_WRITER = """
import sys
from openrelay.store.batches import Batches
from openrelay.store.db import Database

batches = Batches(Database(sys.argv[1]))
for line in sys.stdin:
    org_id, batch_id, n = line.split()
    batches.set_metadata(org_id, batch_id, {"n": n})
    print("committed", flush=True)
"""


@pytest.mark.parametrize("pg_pair", ["1000"], indirect=True)  # a change after a notice waits 1000 s for its own
def test_a_change_whose_notice_never_comes_shows_in_polls_once_kept_rows_age_out(
        pg_pair: tuple[Server, Server, str]) -> None:
    """A process killed (-9) between its commit and its notice, and a write by a tool that sends none (psql): no
    notice ever comes, and polls elsewhere still show the change, since kept rows are used for at most
    ``KEEP_SECONDS`` after their read (docs/guarantees.md, "Polls")."""
    a, b, database = pg_pair
    batch_id = create(a, [chat("one", "hello")])["id"]
    a.wait(batch_id)
    a.stop()  # from here on only this test writes
    wait_for(lambda: _listening(b), "B's cache listening", timeout=30)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database
    writer_process = subprocess.Popen([sys.executable, "-c", _WRITER, url], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
    try:
        with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as writer:
            listener.execute(f"LISTEN {CHANNEL}")
            org_id = writer.execute("SELECT org_id FROM batches WHERE id = %s", (batch_id,)).fetchone()[0]

            def change(n: int) -> None:
                assert writer_process.stdin is not None and writer_process.stdout is not None
                writer_process.stdin.write(f"{org_id} {batch_id} {n}\n")
                writer_process.stdin.flush()
                assert writer_process.stdout.readline() == "committed\n"

            def kept_poll() -> tuple[dict[str, str], bool]:
                """B's answer, and whether it came from kept rows."""
                before = _poll_reads(b).get("kept", 0)
                return _metadata(b, batch_id), _poll_reads(b).get("kept", 0) > before

            def heard() -> list[str]:
                """The notices up to a marker sent now, but B's listener's probes."""
                writer.execute(f"SELECT pg_notify('{CHANNEL}', ' marker')")  # delivered in commit order
                found = []
                for notice in listener.notifies(timeout=10):
                    if notice.payload == " marker":
                        return found
                    if not notice.payload.startswith(" probe "):
                        found.append(notice.payload)
                raise AssertionError(f"no marker within 10 s: {found}")

            change(1)  # the writer's first notice of the organization goes at once, after the commit
            assert next(n.payload for n in listener.notifies(timeout=10)
                        if not n.payload.startswith(" probe ")) == org_id
            wait_for(lambda: kept_poll() == ({"n": "1"}, True), "B to keep what it read of the first change",
                     timeout=10)
            change(2)  # committed; its notice would wait 1000 s, and the writer dies first
            writer_process.kill()
            writer_process.wait()
            assert heard() == []
            wait_for(lambda: _metadata(b, batch_id) == {"n": "2"}, "the change of the killed writer seen by B",
                     timeout=10)

            wait_for(lambda: kept_poll() == ({"n": "2"}, True), "B to keep it", timeout=10)
            writer.execute("UPDATE batches SET metadata = %s WHERE id = %s", ('{"n": "3"}', batch_id))
            assert heard() == []
            wait_for(lambda: _metadata(b, batch_id) == {"n": "3"}, "a tool's change seen by B", timeout=10)
    finally:
        writer_process.kill()
        writer_process.wait()


def test_kept_rows_are_used_for_keep_seconds_after_their_read_began_at_most() -> None:
    """The bound itself, on the cache's own clock: rows read under a token are used until ``KEEP_SECONDS`` after
    the token was taken (before the read), then read again; a notice of their organization ends them sooner."""
    now = [100.0]
    cache = ReadCache("postgresql://unused", clock=lambda: now[0])
    cache.listening = True  # as once its probe came back
    token = cache.token("org")
    now[0] += 0.3  # the read's round trip
    cache.put("key", "org", token, ("row",))
    now[0] = 100.0 + KEEP_SECONDS - 0.001
    assert cache.get("key", "org") == (True, ("row",))
    now[0] = 100.0 + KEEP_SECONDS
    assert cache.get("key", "org") == (False, None)

    cache.put("key", "org", cache.token("org"), ("again",))
    assert cache.get("key", "org") == (True, ("again",))
    cache.changed("org")
    assert cache.get("key", "org") == (False, None)


def test_sqlite_kept_rows_do_not_outlive_the_reader_connection_they_were_read_on(tmp_path) -> None:
    """SQLite's data_version counts on one connection only, and a fresh connection starts its count afresh: a
    thread's reader replaced after an error must not take rows kept on the old one for current."""
    db = Database(f"sqlite:///{tmp_path / 'openrelay.db'}")
    db.migrate()
    try:
        org = Accounts(db).create_org("before")
        read = CompiledRead(sa.select(organizations.c.name).where(organizations.c.id == sa.bindparam("org_id")),
                            cache_by="org_id")
        kept = KeptRows()

        def name() -> str:
            def plan():  # noqa: ANN202
                return (yield FirstRow(read, {"org_id": org.id}))[0]
            return run_plan(db, plan(), kept)

        assert name() == "before"
        compiled._per_thread[db].driver.close()  # the reader breaks, as after a driver error
        with pytest.raises(StoreError):
            name()
        with db.write() as conn:
            conn.execute(organizations.update().where(organizations.c.id == org.id).values(name="after"))
        assert name() == "after"  # on a new connection, whose data_version may equal the old one's
    finally:
        db.dispose()


def test_a_read_with_a_parameter_longer_than_any_stored_value_is_never_kept(server) -> None:
    """A client's 60 KB ``model=`` would only fill the process's memory: such reads go to the store each time."""
    wait_for(lambda: _listening(server), "the cache in use", timeout=30)
    before = _poll_reads(server).get("kept", 0)
    for _ in range(5):
        assert server.http("GET", "/batches", params={"model": "m" * 700}).json()["data"] == []
    assert _poll_reads(server).get("kept", 0) == before
    began = time.monotonic()
    for _ in range(5):
        assert server.http("GET", "/batches", params={"model": "m" * 500}).json()["data"] == []
    assert _poll_reads(server).get("kept", 0) >= before + 4 - (time.monotonic() - began) / KEEP_SECONDS


def test_a_listener_that_never_hears_its_own_probe_keeps_nothing() -> None:
    """Behind PgBouncer in transaction mode a LISTEN and a NOTIFY both succeed, but on different server sessions,
    so no notice ever arrives. (No PgBouncer here: a stand-in connection behaves as it does.) The listener must
    not count itself as listening, so nothing is kept."""

    class Pooled:  # a connection through a pooler in transaction mode
        sent: list[tuple[str, tuple[str, ...] | None]] = []

        async def execute(self, sql: str, args: tuple[str, ...] | None = None) -> None:
            self.sent.append((sql, args))

        async def notifies(self, *, timeout: float):  # noqa: ANN201 - an async generator of nothing
            return
            yield

    async def run() -> tuple[bool, bool, Any]:
        cache = ReadCache("postgresql://unused")
        heard = await cache._hear(Pooled())
        return heard, cache.listening, cache.token("org")

    heard, listening, token = asyncio.run(run())
    assert (heard, listening, token) == (False, False, None)
    assert [sql for sql, _ in Pooled.sent] == ["SELECT pg_notify(%s, %s)"]  # one probe, then it gave up
