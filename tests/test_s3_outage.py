"""The object store unreachable for a while: uploads and downloads answer 503 ``store_unavailable`` with
``Retry-After``, a running batch keeps its answered records and writes them once the store is back, and nothing is
lost or doubled. A SeaweedFS of this module's own is stopped (its data kept) and started again on the same ports;
a PostgreSQL address where nothing listens is 503 the same way."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from openrelay.errors import StoreError, StoreUnavailable
from openrelay.store.db import Database
from tests.support.batches import chat, create, jsonl, results, upload, usage_of, wait_for
from tests.support.seaweed import Seaweed, pause_seaweed, resume_seaweed, start_seaweed, stop_seaweed
from tests.support.server import Server, free_port

pytestmark = pytest.mark.slow  # a SeaweedFS of its own


class Outage:
    """This module's own SeaweedFS and a bucket on it, which a test may stop and start again."""

    def __init__(self) -> None:
        self.server: Seaweed = start_seaweed()
        self.bucket = "orl-outage-" + secrets.token_hex(4)
        assert self.server.bucket_request("PUT", self.bucket).status_code == 200

    def pause(self) -> None:
        pause_seaweed(self.server)

    def resume(self) -> None:
        self.server = resume_seaweed(self.server)


@pytest.fixture(scope="module")
def outage() -> Iterator[Outage]:
    made = Outage()
    try:
        yield made
    finally:
        stop_seaweed(made.server)  # the bucket goes with the server's data directory


def _assert_unavailable(answer) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    error = answer.json()["error"]
    assert error["code"] == "store_unavailable" and error["type"] == "server_error"
    assert "127.0.0.1" not in error["message"]  # the client is told the store is away, not where it is


def test_s3_away_uploads_answer_503_and_a_running_batch_writes_its_results_once_it_is_back(
        make_server: Callable[..., Server], engine, outage: Outage) -> None:
    server = make_server(args=("--blob-url", f"s3://{outage.bucket}/run-{secrets.token_hex(3)}"),
                         concurrency=4, env={**outage.server.env(), "OPENRELAY_FLUSH_RECORDS": "2",
                                             "OPENRELAY_STORE_RETRY_MAX_SECONDS": "0.5"})
    kept = upload(server, jsonl(chat("a", text="kept before the outage")))
    batch_id = create(server, [chat(f"o{i}", f"record {i} #hold=o") for i in range(8)])["id"]
    engine.wait_held("o", 4)  # its input read, four calls in flight

    outage.pause()
    _assert_unavailable(server.http("POST", "/files", files={"file": ("x.jsonl", b"{}\n")},
                                    data={"purpose": "batch"}))
    _assert_unavailable(server.http("GET", f"/files/{kept}/content"))
    engine.release("o")  # the answers come back while the store is away: held by the worker, not lost
    wait_for(lambda: "writing results failed" in server.log(), "a result write to fail", timeout=30)

    outage.resume()
    done = server.wait(batch_id, timeout=120)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    out, err = results(server, done)  # each custom_id on one line
    assert sorted(out) == [f"o{i}" for i in range(8)] and err == {}
    assert done["usage"] == usage_of(out)
    sent = Counter(r["body"]["messages"][0]["content"] for r in engine.requests())
    assert len(sent) == 8 and set(sent.values()) == {1}  # nothing sent twice by the retries
    assert server.http("GET", f"/files/{kept}/content").status_code == 200  # kept through the outage


def test_a_database_server_that_is_away_is_store_unavailable() -> None:
    away = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    try:
        with pytest.raises(StoreUnavailable), away.read() as conn:
            conn.execute(sa.text("SELECT 1"))
    finally:
        away.engine.dispose()


def test_a_sqlite_error_stays_a_store_error(tmp_path) -> None:
    local = Database(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(StoreError) as failure, local.read() as conn:
            conn.execute(sa.text("SELECT * FROM no_such_table"))
        assert not isinstance(failure.value, StoreUnavailable)  # a local file's error: no server to wait for
    finally:
        local.engine.dispose()
