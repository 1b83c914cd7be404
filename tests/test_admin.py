"""`orl admin` as operators run it: straight on the store of a running `orl serve`, checked through the API."""

from __future__ import annotations

import hashlib
import json
import secrets
import stat
from pathlib import Path

import orjson

from tests.conftest import BACKEND
from tests.support.cli import ok
from tests.support.polling import wait_for


def _new_org(server) -> str:
    name = f"org-{secrets.token_hex(4)}"
    made = ok(server.admin("org", "create", name))
    assert made["name"] == name and made["id"].startswith("org_") and made["expedited"] is True
    return name


def _new_key(server, org: str, *extra: str) -> str:
    done = server.admin("key", "create", "--org", org, *extra)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # only the secret, nothing else
    return lines[0]


def _input(tmp_path: Path, n: int = 1) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(
        orjson.dumps({"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "test/echo", "messages": [{"role": "user", "content": f"hi {i}"}]}}) + b"\n"
        for i in range(n)))
    return path


def _error_code(done) -> str:
    return json.loads(done.stdout)["error"]["code"]


def test_org_create_list_and_duplicate(server):
    name = _new_org(server)
    again = server.admin("org", "create", name)
    assert again.returncode != 0
    assert "already exists" in again.stderr and name in again.stderr
    assert again.stdout == ""
    orgs = ok(server.admin("org", "list"))
    names = [o["name"] for o in orgs]
    assert names.count(name) == 1 and "default" in names  # no second org was made


def test_org_set_expedited_off_and_on(server, tmp_path):
    name = _new_org(server)
    key = _new_key(server, name)
    path = _input(tmp_path)
    off = ok(server.admin("org", "set", name, "--expedited", "off"))
    assert off["name"] == name and off["expedited"] is False
    listed = {o["name"]: o for o in ok(server.admin("org", "list"))}
    assert listed[name]["expedited"] is False and listed["default"]["expedited"] is True

    refused = server.orl("batches", "create", "--input-file", str(path), "--priority", "expedited", api_key=key)
    assert refused.returncode == 6, refused
    assert _error_code(refused) == "feature_disabled"
    # Another organization is not affected.
    other = ok(server.orl("batches", "create", "--input-file", str(path), "--priority", "expedited"))
    assert other["priority"] == "expedited"

    on = ok(server.admin("org", "set", name, "--expedited", "on"))
    assert on["expedited"] is True
    batch = ok(server.orl("batches", "create", "--input-file", str(path), "--priority", "expedited", api_key=key))
    assert batch["priority"] == "expedited"

    bad = server.admin("org", "set", name, "--expedited", "maybe")
    assert bad.returncode != 0
    unknown = server.admin("org", "set", "no-such-org", "--expedited", "off")
    assert unknown.returncode != 0 and "no-such-org" in unknown.stderr


def test_key_create_prints_only_a_working_key(server, tmp_path):
    name = _new_org(server)
    key = _new_key(server, name)
    assert key != server.api_key and key.strip() == key and " " not in key
    models = ok(server.orl("models", api_key=key))
    assert {m["id"] for m in models["data"]} == {"test/echo", "test/embed"}
    batch = ok(server.orl("batches", "create", "--input-file", str(_input(tmp_path, 2)), api_key=key))
    assert server.wait(batch["id"], api_key=key)["status"] == "completed"
    # The key belongs to the new organization: the default org's key cannot see its batch, and vice versa.
    assert server.orl("batches", "get", batch["id"]).returncode == 4
    assert [b["id"] for b in ok(server.orl("batches", "list", api_key=key))["data"]] == [batch["id"]]

    unknown = server.admin("key", "create", "--org", "no-such-org")
    assert unknown.returncode != 0 and unknown.stdout == "" and "no-such-org" in unknown.stderr
    bad_scope = server.admin("key", "create", "--org", name, "--scopes", "batch.read,everything")
    assert bad_scope.returncode != 0 and bad_scope.stdout == "" and "everything" in bad_scope.stderr


def test_read_only_key_cannot_create(server, tmp_path):
    name = _new_org(server)
    writer = _new_key(server, name)
    reader = _new_key(server, name, "--scopes", "batch.read")
    file_id = ok(server.orl("files", "upload", str(_input(tmp_path)), api_key=writer))["id"]
    done = server.orl("batches", "create", "--input-file-id", file_id, api_key=reader)
    assert done.returncode == 3, done
    assert _error_code(done) == "insufficient_scope"
    assert server.http("POST", "/batches", api_key=reader,
                       json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                             "completion_window": "24h"}).status_code == 403
    # Reading is what it may do, and nothing was created.
    assert ok(server.orl("batches", "list", api_key=reader))["data"] == []
    # files.write is not among its scopes either.
    upload = server.orl("files", "upload", str(_input(tmp_path)), api_key=reader)
    assert upload.returncode == 3 and _error_code(upload) == "insufficient_scope"
    keys = {k["prefix"]: k for k in ok(server.admin("key", "list", "--org", name))}
    assert keys[reader[:12]]["scopes"] == ["batch.read"]


def test_zero_budget_key_gets_402(server, tmp_path):
    name = _new_org(server)
    key = _new_key(server, name, "--budget-usd", "0")
    done = server.orl("batches", "create", "--input-file", str(_input(tmp_path)), api_key=key)
    assert done.returncode == 5, done
    assert _error_code(done) == "key_budget_exceeded"
    assert ok(server.orl("batches", "list", api_key=key))["data"] == []
    # A key with budget left in the same organization creates fine.
    funded = _new_key(server, name, "--budget-usd", "5")
    assert ok(server.orl("batches", "create", "--input-file", str(_input(tmp_path)), api_key=funded))["id"]
    views = {k["prefix"]: k for k in ok(server.admin("key", "list", "--org", name))}
    assert views[key[:12]]["budget_usd"] == 0 and views[funded[:12]]["budget_usd"] == 5


def test_key_list_never_shows_secrets(server):
    name = _new_org(server)
    first = _new_key(server, name)
    second = _new_key(server, name, "--scopes", "files.read,files.write")
    for args in (("key", "list"), ("key", "list", "--org", name)):
        done = server.admin(*args)
        keys = ok(done)
        for secret in (first, second, server.api_key):
            assert secret not in done.stdout and secret not in done.stderr
        assert {k["prefix"] for k in keys} >= {first[:12], second[:12]}
    mine = ok(server.admin("key", "list", "--org", name))
    assert len(mine) == 2 and all(k["id"].startswith("key_") and k["revoked_at"] is None for k in mine)
    assert {tuple(k["scopes"]) for k in mine} == {
        ("batch.read", "batch.write", "files.read", "files.write"), ("files.read", "files.write")}
    everyone = ok(server.admin("key", "list"))
    assert len(everyone) == 3  # the bootstrap key too


def test_key_revoke_stops_the_key(server):
    name = _new_org(server)
    keep = _new_key(server, name)
    doomed = _new_key(server, name)
    assert ok(server.orl("batches", "list", api_key=doomed))["object"] == "list"
    key_id = next(k["id"] for k in ok(server.admin("key", "list", "--org", name)) if k["prefix"] == doomed[:12])
    revoked = ok(server.admin("key", "revoke", key_id))
    assert revoked["id"] == key_id and revoked["revoked_at"] is not None
    assert doomed not in json.dumps(revoked)
    # The server may go on taking the key for up to its key cache's TTL (a second by default), no longer.
    wait_for(lambda: server.http("GET", "/models", api_key=doomed).status_code == 401, "the revoked key refused",
             timeout=5)
    done = server.orl("batches", "list", api_key=doomed)
    assert done.returncode == 3 and _error_code(done) == "invalid_api_key"
    assert server.http("GET", "/models", api_key=doomed).status_code == 401
    # The organization's other key still works.
    assert ok(server.orl("batches", "list", api_key=keep))["object"] == "list"
    assert server.admin("key", "revoke", "key_0000000000000000").returncode != 0


def test_keys_are_stored_hashed(server):
    name = _new_org(server)
    key = _new_key(server, name)
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert ok(server.orl("models", api_key=key))["object"] == "list"  # the key is live
    if BACKEND == "sqlite":
        stored = b""
        for path in sorted(server.data_dir.glob("openrelay.db*")):
            stored += path.read_bytes()
        assert (server.data_dir / "openrelay.db").exists()
        # The hash is there (so these are the right bytes), the secret is not.
        assert digest.encode() in stored
        assert key.encode() not in stored
        assert server.api_key.encode() not in stored
    else:
        import psycopg

        with psycopg.connect(server.database_url) as conn:
            rows = conn.execute("SELECT * FROM api_keys").fetchall()
            hashes = [r[0] for r in conn.execute("SELECT key_hash FROM api_keys").fetchall()]
        assert len(rows) == 2
        # Exactly the SHA-256 of each key: the new one and the bootstrap key.
        assert sorted(hashes) == sorted([digest, hashlib.sha256(server.api_key.encode()).hexdigest()])
        for row in rows:
            assert all(key not in str(col) and server.api_key not in str(col) for col in row)


def test_serve_bootstraps_default_org_and_key_file(server):
    key_file = server.data_dir / "api-key"
    assert key_file.exists()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    secret = key_file.read_text().strip()
    assert secret and secret == server.api_key
    assert str(key_file) in server.log()
    orgs = ok(server.admin("org", "list"))
    assert [o["name"] for o in orgs] == ["default"]
    keys = ok(server.admin("key", "list", "--org", "default"))
    assert len(keys) == 1 and keys[0]["prefix"] == secret[:12]
    assert len(keys[0]["scopes"]) == 4
    assert ok(server.orl("models", api_key=secret))["object"] == "list"


def test_restart_keeps_the_bootstrap_key(server):
    first = (server.data_dir / "api-key").read_text()
    server.stop()
    server.start()
    assert (server.data_dir / "api-key").read_text() == first
    assert [o["name"] for o in ok(server.admin("org", "list"))] == ["default"]
    assert ok(server.orl("models"))["object"] == "list"


def test_admin_on_data_dir(server):
    """Without --database-url, admin finds the SQLite store in --data-dir (the operator's usual call)."""
    import subprocess

    from tests.support.forked import ORL

    if BACKEND == "sqlite":
        target = ["--data-dir", str(server.data_dir)]
    else:
        target = ["--database-url", server.database_url]
    done = subprocess.run([ORL, "admin", *target, "org", "list"], capture_output=True, text=True, timeout=120)
    assert [o["name"] for o in ok(done)] == ["default"]
