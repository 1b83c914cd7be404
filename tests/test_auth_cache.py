"""The brief memory of live keys that makes a poll one database round trip: a revoked key stops working within
``key_cache_seconds`` (at most two seconds) with no signal between processes, and whatever writes reads the key
fresh. The TTL is checked with a clock the test owns (real store, no waiting); the server tests revoke with
`orl admin` in another process and ask again once the TTL has passed since the revoke committed, so they hold
however slow the machine is.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator

import pytest

from openrelay.config import ReadCaches
from openrelay.errors import Unauthorized
from openrelay.service.auth import MAX_KEY_CACHE_SECONDS, KeyCache
from openrelay.store.accounts import Accounts
from openrelay.store.db import Database
from tests.support.batches import org_key, wait_for

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

TTL = 1.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def accounts(tmp_path) -> Iterator[Accounts]:
    db = Database(f"sqlite:///{tmp_path / 'keys.db'}")
    db.migrate()
    yield Accounts(db)
    db.dispose()


def _bearer(secret: str) -> str:
    return f"Bearer {secret}"


def test_a_read_uses_the_key_until_the_ttl_passes_then_sees_the_revoke(accounts):
    org = accounts.create_org("o")
    key, secret = accounts.create_key(org.id)
    clock = Clock()
    keys = KeyCache(accounts, TTL, clock)
    assert keys.cached(_bearer(secret)) is None  # nothing remembered before the first read
    assert keys.for_read(_bearer(secret)).id == key.id
    accounts.revoke_key(key.id)
    clock.now += TTL - 0.001
    assert keys.cached(_bearer(secret)).id == key.id  # remembered: no store read within the TTL
    assert keys.for_read(_bearer(secret)).id == key.id
    clock.now += 0.001
    assert keys.cached(_bearer(secret)) is None
    with pytest.raises(Unauthorized):
        keys.for_read(_bearer(secret))


def test_a_write_reads_the_key_fresh(accounts):
    org = accounts.create_org("o")
    key, secret = accounts.create_key(org.id)
    clock = Clock()
    keys = KeyCache(accounts, TTL, clock)
    keys.for_read(_bearer(secret))
    accounts.set_budget(key.id, 0)
    assert keys.authenticate(_bearer(secret)).budget_nano_usd == 0  # the spend check sees the store now
    assert keys.for_read(_bearer(secret)).budget_nano_usd is None  # a read may see it as it was
    accounts.revoke_key(key.id)
    with pytest.raises(Unauthorized):
        keys.authenticate(_bearer(secret))


def test_unknown_and_revoked_keys_are_not_remembered(accounts):
    org = accounts.create_org("o")
    key, secret = accounts.create_key(org.id)
    accounts.revoke_key(key.id)
    keys = KeyCache(accounts, TTL, Clock())
    for authorization in (_bearer(secret), _bearer("orl-not-a-key"), None, "Basic abc"):
        with pytest.raises(Unauthorized):
            keys.for_read(authorization)
        assert keys.cached(authorization) is None


def test_the_ttl_cannot_outlast_the_two_second_promise(accounts):
    assert ReadCaches.key_cache_seconds <= MAX_KEY_CACHE_SECONDS == 2.0
    with pytest.raises(ValueError):
        KeyCache(accounts, MAX_KEY_CACHE_SECONDS + 0.5)
    KeyCache(accounts, 0)  # 0: no memory at all


def _key_id(server, org: str, secret: str) -> str:
    listed = server.admin("key", "list", "--org", org)
    assert listed.returncode == 0, listed.stderr
    (key_id,) = [k["id"] for k in json.loads(listed.stdout) if secret.startswith(k["prefix"])]
    return key_id


def test_a_key_revoked_by_another_process_stops_working_once_the_ttl_passed(server):
    org = f"org-{secrets.token_hex(4)}"
    assert server.admin("org", "create", org).returncode == 0
    doomed = org_key(server, org)
    assert server.http("GET", "/batches", api_key=doomed).status_code == 200  # remembered now
    assert server.http("GET", "/files", api_key=doomed).status_code == 200
    revoked = server.admin("key", "revoke", _key_id(server, org, doomed))
    assert revoked.returncode == 0, revoked.stderr
    committed_by = time.monotonic()  # the server's clock too: CLOCK_MONOTONIC is the machine's
    # A write never trusts the memory.
    refused = server.http("POST", "/batches", api_key=doomed, json={})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    # Any remembered entry was read before the revoke committed, so it is gone by committed_by + TTL: a read sent
    # after that is refused, one sent before may still be answered from memory. Ask until one is refused.
    forgotten_by = committed_by + ReadCaches.key_cache_seconds

    def refused() -> bool:
        sent = time.monotonic()
        answer = server.http("GET", "/batches", api_key=doomed)
        if answer.status_code == 200:
            assert sent < forgotten_by, f"a read sent {sent - committed_by:.3f} s after the revoke used the key"
            return False
        assert answer.status_code == 401, answer.text
        return True

    wait_for(refused, "a read to be refused", timeout=30)
    for path in ("/batches", "/batches?limit=5", "/batches/batch_000000000000", "/files", "/models"):
        answer = server.http("GET", path, api_key=doomed)
        assert answer.status_code == 401, (path, answer.text)
        assert answer.json()["error"]["code"] == "invalid_api_key"


def test_a_budget_used_up_meanwhile_refuses_the_next_create_at_once(server):
    org = f"org-{secrets.token_hex(4)}"
    assert server.admin("org", "create", org).returncode == 0
    secret = org_key(server, org)
    assert server.http("GET", "/batches", api_key=secret).status_code == 200  # remembered, no budget
    done = server.admin("key", "set-budget", _key_id(server, org, secret), "--budget-usd", "0")
    assert done.returncode == 0, done.stderr
    refused = server.http("POST", "/batches", api_key=secret, json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "requests": [{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "test/echo", "messages": [{"role": "user", "content": "hi"}]}}]})
    assert refused.status_code == 402, refused.text
    assert refused.json()["error"]["code"] == "key_budget_exceeded"
