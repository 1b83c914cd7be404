"""The API's poll cache (api/poll_cache.py): a poll's answer is reused for ``OPENRELAY_POLL_CACHE_SECONDS`` after the
read that made it began, and never after a write of this process to its organization (through the API or the
dashboard), so a client sees its own write in its very next poll. The class on a clock the test moves; the server on
the suite's store, with answers kept ten minutes so that only a write can end them."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from openrelay.api.poll_cache import PollCache
from openrelay.store.db import Database
from tests.support.batches import chat, create, get
from tests.support.browser import signed_in_client


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_reused_until_seconds_after_its_read_began() -> None:
    clock = Clock()
    polls = PollCache(0.25, clock=clock)
    token = polls.token("org")
    clock.now += 0.1  # the read took this long
    polls.put("key", "org", "/v1/batches/b", token, b"answer")
    assert polls.get("key", "/v1/batches/b") == b"answer"
    assert polls.get("other key", "/v1/batches/b") is None  # per key: its scopes are its own
    assert polls.get("key", "/v1/batches/c") is None
    clock.now += 0.149
    assert polls.get("key", "/v1/batches/b") == b"answer"
    clock.now += 0.001
    assert polls.get("key", "/v1/batches/b") is None  # 0.25 s after the read began


def test_a_write_forgets_its_organizations_answers_and_the_reads_in_flight() -> None:
    clock = Clock()
    polls = PollCache(10, clock=clock)
    polls.put("key", "org", "/a", polls.token("org"), b"a")
    polls.put("other", "other org", "/a", polls.token("other org"), b"b")
    in_flight = polls.token("org")
    polls.forget("org")
    assert polls.get("key", "/a") is None
    assert polls.get("other", "/a") == b"b"  # another organization's answers stay
    polls.put("key", "org", "/a", in_flight, b"read before the write")
    assert polls.get("key", "/a") is None  # began before the write: not kept
    polls.put("key", "org", "/a", polls.token("org"), b"read after it")
    assert polls.get("key", "/a") == b"read after it"


def test_nothing_is_kept_when_off_past_its_bytes_or_for_a_long_url() -> None:
    clock = Clock()
    off = PollCache(0, clock=clock)
    off.put("key", "org", "/a", off.token("org"), b"a")
    assert off.get("key", "/a") is None
    polls = PollCache(1, max_bytes=10, clock=clock)
    polls.put("key", "org", "/a", polls.token("org"), b"12345")
    polls.put("key", "org", "/b?model=" + "x" * 3000, polls.token("org"), b"1")
    assert polls.get("key", "/b?model=" + "x" * 3000) is None
    clock.now += 2
    polls.put("key", "org", "/c", polls.token("org"), b"123456")  # over 10 bytes: the expired /a goes
    assert polls.get("key", "/c") == b"123456"
    polls.put("key", "org", "/d", polls.token("org"), b"12345")  # still over: everything goes first
    assert (polls.get("key", "/c"), polls.get("key", "/d")) == (None, b"12345")


def test_polls_that_miss_together_share_one_read_but_not_past_a_write() -> None:
    async def scenario() -> None:
        polls = PollCache(10, clock=Clock())
        reads: list[asyncio.Event] = []

        async def read() -> bytes:
            reads.append(done := asyncio.Event())
            n = len(reads)
            await done.wait()
            return f"read {n}".encode()

        async def settle() -> None:  # let every task run until it waits
            for _ in range(10):
                await asyncio.sleep(0)

        first = [asyncio.ensure_future(polls.answer("key", "org", "/a", read)) for _ in range(3)]
        await settle()
        assert len(reads) == 1  # three polls, one read
        polls.forget("org")  # a write: the next poll may not share the read that began before it
        after = asyncio.ensure_future(polls.answer("key", "org", "/a", read))
        await settle()
        assert len(reads) == 2
        for done in reads:
            done.set()
        assert await asyncio.gather(*first, after) == [b"read 1"] * 3 + [b"read 2"]
        assert polls.get("key", "/a") == b"read 2"  # the first read began before the write: not kept

        async def refused() -> bytes:
            raise LookupError("no such batch")

        with pytest.raises(LookupError):  # an error reaches the poll, and nothing is kept
            await polls.answer("key", "org", "/b", refused)
        assert polls.get("key", "/b") is None

    asyncio.run(scenario())


def _store_metadata(server, batch_id: str, value: str) -> None:
    """A change made behind the API's back, as another process would make it."""
    db = Database(server.database_url)
    try:
        with db.write() as conn:
            conn.execute(sa.text("UPDATE batches SET metadata = :m WHERE id = :id"),
                         {"m": f'{{"by": "{value}"}}', "id": batch_id})
    finally:
        db.dispose()


def test_a_poll_is_answered_from_the_cache_until_a_write_of_this_process_to_its_organization(make_server) -> None:
    server = make_server(env={"OPENRELAY_POLL_CACHE_SECONDS": "600"}, args=("--no-worker",))
    batch_id = create(server, [chat("one")])["id"]
    assert get(server, batch_id)["metadata"] is None
    assert [row["id"] for row in server.http("GET", "/batches").json()["data"]] == [batch_id]
    _store_metadata(server, batch_id, "elsewhere")
    assert get(server, batch_id)["metadata"] is None  # kept: the change was not this process's
    assert server.http("GET", "/batches").json()["data"][0]["metadata"] is None

    made = create(server, [chat("two")])["id"]  # a create: the page shows it at once
    assert [row["id"] for row in server.http("GET", "/batches").json()["data"]] == [made, batch_id]
    assert get(server, batch_id)["metadata"] == {"by": "elsewhere"}

    answer = server.http("POST", f"/batches/{batch_id}/metadata", json={"metadata": {"round": "1"}})
    assert answer.status_code == 200
    assert get(server, batch_id)["metadata"] == {"round": "1"}
    assert server.http("POST", f"/batches/{batch_id}/cancel").status_code == 200
    assert get(server, batch_id)["status"] == "cancelling"  # no worker here to end it

    assert get(server, made)["status"] == "validating"
    with signed_in_client(server) as (client, csrf):  # the dashboard's writes forget too
        assert client.post(f"/batches/{made}/cancel", data={"csrf": csrf}).status_code == 303
    assert get(server, made)["status"] == "cancelling"
