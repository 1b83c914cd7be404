"""Store outages mid-batch: a PostgreSQL server the test owns, stopped and started again, and a blob path that
cannot be written. Result writes back off, lanes stop taking records while a chunk cannot be written (so memory
stays bounded), and once the store is back every record lands once: none lost, none sent to the engine twice. And a
server that takes the connection but never answers: a read gives up after ``CONNECT_SECONDS``."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from openrelay.errors import StoreUnavailable
from openrelay.store.db import Database
from tests.support.batches import chat, create, results, usage_of, wait_for
from tests.support.server import TEST_CATALOG, Server, free_port

FLUSH, CONCURRENCY, TOTAL = 20, 8, 400
ENV = {"OPENRELAY_FLUSH_RECORDS": str(FLUSH), "OPENRELAY_STORE_RETRY_MAX_SECONDS": "0.5",
       "OPENRELAY_LEASE_SECONDS": "120", "OPENRELAY_TICK_SECONDS": "0.05", "OPENRELAY_RETRY_BASE_SECONDS": "0.05"}
# While no chunk can be written: at most 2 x FLUSH finished records wait (each lane checks for room before taking
# a record, so CONCURRENCY more may slip in), plus CONCURRENCY in flight.
MOST_SENT_WHILE_DOWN = 2 * FLUSH + 2 * CONCURRENCY


@dataclass
class OwnPostgres:
    """A PostgreSQL server of this test alone, so the test may stop it."""

    bindir: Path
    datadir: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args]
        subprocess.run(_as_postgres(cmd), check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._pg_ctl("-w", "-l", str(self.datadir / "server.log"), "-o",
                     f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.datadir}", "start")

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "stop")


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root; CI runs as root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    bindir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
    root = Path(tempfile.mkdtemp(prefix="orl-pg-"))  # not under pytest's 0700 root-owned tmp: postgres reads it
    datadir = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(_as_postgres([str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", "postgres"]),
                   check=True, capture_output=True, timeout=120)
    pg = OwnPostgres(bindir=bindir, datadir=datadir, port=free_port())
    pg.start()
    try:
        yield pg
    finally:
        subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def _write_failures(server: Server) -> int:
    return server.log().count("results failed")


def _check_all_landed_once(server: Server, engine, batch_id: str) -> None:
    batch = server.wait(batch_id, timeout=180)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": TOTAL, "completed": TOTAL, "failed": 0}
    out, err = results(server, batch)
    assert len(out) == TOTAL and err == {}
    assert batch["usage"] == usage_of(out)
    assert engine.stats()["requests"] == TOTAL  # no record was sent to the engine twice


def _held_batch(server: Server, engine) -> str:
    batch_id = create(server, [chat(f"r{i}", f"row {i} #hold=go") for i in range(TOTAL)])["id"]
    engine.wait_held("go", CONCURRENCY)
    return batch_id


def test_database_stopped_mid_batch_and_started_again_loses_and_doubles_nothing(own_postgres, engine,
                                                                                 engine_url, tmp_path):
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(TEST_CATALOG.format(engine=engine_url, slots=1, concurrency=CONCURRENCY))
    server = Server(data_dir=tmp_path, database_url=own_postgres.url, port=free_port(), env=ENV,
                    args=["--catalog", str(catalog)]).start()
    try:
        batch_id = _held_batch(server, engine)
        own_postgres.stop()
        engine.release("go")  # the held calls answer; their results cannot be written now
        wait_for(lambda: _write_failures(server) >= 3, "result writes to fail and back off", timeout=60)
        assert engine.stats()["requests"] <= MOST_SENT_WHILE_DOWN
        for path in (f"/batches/{batch_id}", "/batches?limit=5"):  # polls: a 503 to try again, never a 500
            answer = server.http("GET", path)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "store_unavailable" and answer.headers["retry-after"]
        own_postgres.start()
        wait_for(lambda: server.http("GET", f"/batches/{batch_id}").status_code == 200, "polls to answer again",
                 timeout=60)
        _check_all_landed_once(server, engine, batch_id)
    finally:
        server.stop()


def test_blob_path_that_cannot_be_written_holds_the_lanes_until_it_can(make_server, engine):
    server = make_server(slots=1, concurrency=CONCURRENCY, env=ENV)
    batch_id = _held_batch(server, engine)
    # Chunks of this batch go under batches/<id>/chunks/: a plain file in that place makes every write fail
    # (permissions would not stop root).
    blocker = server.data_dir / "blobs" / "batches" / batch_id / "chunks"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"in the way")
    engine.release("go")
    wait_for(lambda: _write_failures(server) >= 3, "result writes to fail and back off", timeout=60)
    assert engine.stats()["requests"] <= MOST_SENT_WHILE_DOWN
    blocker.unlink()
    _check_all_landed_once(server, engine, batch_id)


def test_a_server_that_never_answers_is_unavailable_once_the_connect_timeout_passes() -> None:
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)  # the kernel takes the connection; nothing answers
    away = Database(f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/nothing")
    try:
        with pytest.raises(StoreUnavailable), away.read() as conn:
            conn.execute(sa.text("SELECT 1"))
    finally:
        away.dispose()
        silent.close()
