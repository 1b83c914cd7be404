"""Webhooks end to end, against a real receiver process (tests/support/webhook_receiver.py): endpoints through
the API and `orl admin webhook`, every terminal status's event signed per Standard Webhooks and verified with the
`standardwebhooks` package and the OpenAI SDK, retries with backoff while the receiver fails, giving up, the
network rules, and the delivery log.

The kill -9 tests are in tests/test_webhooks_crash.py; the store's outbox and claims in
tests/unit/test_webhooks_store.py.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import openai
import pytest
import schemathesis
from schemathesis import checks as st_checks
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support import http_client
from tests.support.batches import chat, create, get, wait_for
from tests.support.server import Server
from tests.support.test_engine import EngineControl
from tests.support.webhook_fixtures import FAST, hook_catalog
from tests.support.webhook_receiver import Receiver
from tests.test_openapi import CHECKS, DOCUMENT_PATH

SCHEMA = schemathesis.openapi.from_path(DOCUMENT_PATH)


def register(server: Server, url: str, api_key: str | None = None) -> dict[str, Any]:
    answer = server.http("POST", "/webhooks", api_key=api_key, json={"url": url})
    assert answer.status_code == 200, answer.text
    return answer.json()


def verified(secret: str, request: dict[str, Any]) -> dict[str, Any]:
    """The event, after the standardwebhooks package verified its signature with ``secret``."""
    return Webhook(secret).verify(request["body"], request["headers"])


def delivery_log(server: Server, *args: str) -> list[dict[str, Any]]:
    shown = server.admin("webhook", "log", *args)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def name() -> str:
    return secrets.token_hex(4)


# -- endpoints ----------------------------------------------------------------------------------------------------


def test_endpoints_through_the_api(org: Server, receiver: Receiver) -> None:
    made = register(org, receiver.url("api"))
    assert made["id"].startswith("wh_") and made["object"] == "webhook_endpoint"
    assert made["url"] == receiver.url("api") and isinstance(made["created_at"], int)
    assert made["secret"].startswith("whsec_")
    public = register(org, "https://Hooks.Example.com/a/./b")  # a public name needs no allow entry
    assert public["url"] == "https://hooks.example.com/a/b"  # kept as it will be connected to
    listed = org.http("GET", "/webhooks").json()
    assert listed == {"object": "list", "has_more": False, "first_id": made["id"], "last_id": public["id"], "data": [
        {k: v for k, v in made.items() if k != "secret"}, {k: v for k, v in public.items() if k != "secret"}]}

    other = org.for_new_org()  # another organization sees none of them and cannot remove them
    assert other.http("GET", "/webhooks").json()["data"] == []
    assert other.http("DELETE", f"/webhooks/{made['id']}").status_code == 404

    gone = org.http("DELETE", f"/webhooks/{made['id']}")
    assert gone.status_code == 200 and gone.json() == {"id": made["id"], "object": "webhook_endpoint.deleted",
                                                       "deleted": True}
    assert org.http("DELETE", f"/webhooks/{made['id']}").status_code == 404
    assert [e["id"] for e in org.http("GET", "/webhooks").json()["data"]] == [public["id"]]


def test_endpoints_through_the_openai_sdk(org: Server, receiver: Receiver) -> None:
    """The SDK has no webhooks resource for this; its generic calls reach the routes with its auth and errors."""
    client = org.client()
    made = client.post("/webhooks", body={"url": receiver.url("sdk")}, cast_to=object)
    assert made["secret"].startswith("whsec_") and made["url"] == receiver.url("sdk")
    assert [e["id"] for e in client.get("/webhooks", cast_to=object)["data"]] == [made["id"]]
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/webhooks", body={"url": "http://169.254.169.254/"}, cast_to=object)
    assert refused.value.body["param"] == "url"
    assert client.delete(f"/webhooks/{made['id']}", cast_to=object)["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        client.delete(f"/webhooks/{made['id']}", cast_to=object)


def test_endpoints_need_batch_write(org: Server, receiver: Receiver) -> None:
    reader = org.new_org_key(None, "--scopes", "batch.read,files.read,files.write")
    for method, path, body in (("POST", "/webhooks", {"url": receiver.url("x")}), ("GET", "/webhooks", None),
                               ("DELETE", "/webhooks/wh_0000000000000000", None)):
        answer = org.http(method, path, api_key=reader, json=body)
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "insufficient_scope"
    assert org.http("GET", "/webhooks", api_key="").status_code == 401


@pytest.mark.parametrize(("url", "why"), [
    ("http://169.254.169.254/latest/meta-data", "link-local or metadata"),
    ("http://[fe80::1]/hook", "link-local or metadata"),
    ("http://[::ffff:169.254.169.254]/hook", "link-local or metadata"),
    ("http://[fd00:ec2::254]/hook", "link-local or metadata"),
    ("http://100.100.100.200/hook", "link-local or metadata"),
    ("http://10.1.2.3/hook", "loopback or private"),
    ("http://192.168.0.10:8080/hook", "loopback or private"),
    ("http://[::1]/hook", "loopback or private"),
    ("http://[::ffff:127.0.0.1]/hook", "loopback or private"),
    ("http://127.0.0.1:1/hooks/x", "loopback or private"),  # allowed is the receiver's port only
    ("ftp://hooks.example.com/x", "http(s)"),
    ("https://user:pw@hooks.example.com/x", "userinfo"),
    ("https://hooks.example.com/a%2Fb", "encoded slash"),
    ("", "http(s)"),
    (7, "http(s)"),
])
def test_endpoint_urls_refused(org: Server, url: Any, why: str) -> None:
    answer = org.http("POST", "/webhooks", json={"url": url})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "url" and why in error["message"], error


def test_loopback_only_under_an_allow_entry(org: Server, receiver: Receiver) -> None:
    # The entry covers /hooks/ on the receiver's port: a path beside it is not covered.
    answer = org.http("POST", "/webhooks", json={"url": f"{receiver.base}/elsewhere"})
    assert answer.status_code == 400 and "loopback or private" in answer.json()["error"]["message"]
    assert register(org, f"{receiver.base}/hooks/../hooks/y")["url"] == receiver.url("y")


def test_create_refuses_other_fields_and_bad_bodies(org: Server) -> None:
    for body in ({"url": "https://hooks.example.com/", "description": "mine"}, {}):
        answer = org.http("POST", "/webhooks", json=body)
        assert answer.status_code == 400
    answer = org.http("POST", "/webhooks", content=b"{nope", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]


def test_an_organization_has_at_most_16_endpoints(org: Server) -> None:
    for i in range(16):
        register(org, f"https://hooks.example.com/{i}")
    answer = org.http("POST", "/webhooks", json={"url": "https://hooks.example.com/16"})
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "webhook_limit_reached"


def test_answers_are_as_documented(org: Server, receiver: Receiver) -> None:
    def call(method: str, path: str, expect: int, **case: Any) -> Any:
        response = SCHEMA[path][method].Case(**case).call_and_validate(
            base_url=org.base_url.removesuffix("/v1"), headers={"Authorization": f"Bearer {org.api_key}"},
            checks=[getattr(st_checks, check) for check in CHECKS])
        assert response.status_code == expect, response.text
        return response.json()

    made = call("POST", "/v1/webhooks", 200, body={"url": receiver.url("doc")})
    call("POST", "/v1/webhooks", 400, body={"url": "http://169.254.169.254/"})
    call("GET", "/v1/webhooks", 200)
    call("DELETE", "/v1/webhooks/{webhook_id}", 200, path_parameters={"webhook_id": made["id"]})
    call("DELETE", "/v1/webhooks/{webhook_id}", 404, path_parameters={"webhook_id": made["id"]})
    call("DELETE", "/v1/webhooks/{webhook_id}", 404, path_parameters={"webhook_id": "wh_\x00"})


# -- events -------------------------------------------------------------------------------------------------------


def test_completed_batch_sends_one_signed_event(org: Server, receiver: Receiver) -> None:
    hook = name()
    secret = register(org, receiver.url(hook))["secret"]
    before = int(time.time())
    batch = create(org, [chat("a", "hello"), chat("b", "world")])
    done = org.wait(batch["id"])
    assert done["status"] == "completed"
    got = receiver.wait_for(hook, lambda r: len(r) == 1 and r[0]["answered"] == 200, "the event")
    event = verified(secret, got[0])
    assert event == {"id": got[0]["headers"]["webhook-id"], "object": "event", "type": "batch.completed",
                     "created_at": event["created_at"], "data": {"id": batch["id"]}}
    assert event["id"].startswith("evt_") and event["created_at"] == done["completed_at"]
    assert before <= int(got[0]["headers"]["webhook-timestamp"]) <= time.time()  # signed as it was sent
    assert got[0]["headers"]["content-type"] == "application/json"
    # The OpenAI SDK's own verification takes the secret as it is, and parses the event as OpenAI's.
    unwrapped = org.client().webhooks.unwrap(got[0]["body"], got[0]["headers"], secret=secret)
    assert unwrapped.type == "batch.completed" and unwrapped.data.id == batch["id"] and unwrapped.id == event["id"]
    # A signature made with another secret, or over another body, does not verify.
    with pytest.raises(WebhookVerificationError):
        verified(register(org, receiver.url(name()))["secret"], got[0])
    with pytest.raises(WebhookVerificationError):
        verified(secret, {**got[0], "body": got[0]["body"].replace(b"completed", b"cancelled")})
    with pytest.raises(openai.InvalidWebhookSignatureError):
        org.client().webhooks.verify_signature(got[0]["body"] + b" ", got[0]["headers"], secret=secret)


def test_cancelled_batch_sends_its_event_to_every_endpoint(org: Server, receiver: Receiver,
                                                           engine: EngineControl) -> None:
    first, second, removed = name(), name(), name()
    secrets_by_hook = {hook: register(org, receiver.url(hook))["secret"] for hook in (first, second, removed)}
    gone = org.http("GET", "/webhooks").json()["data"][2]
    assert org.http("DELETE", f"/webhooks/{gone['id']}").status_code == 200
    gate = f"cancel-{first}"
    batch = create(org, [chat(f"c{i}", f"held {i} #hold={gate}") for i in range(3)])
    engine.wait_held(gate)
    assert org.http("POST", f"/batches/{batch['id']}/cancel").status_code == 200
    engine.release(gate)
    assert org.wait(batch["id"])["status"] == "cancelled"
    ids = set()
    for hook in (first, second):
        got = receiver.wait_for(hook, lambda r: len(r) == 1, "the cancelled event")
        event = verified(secrets_by_hook[hook], got[0])
        assert event["type"] == "batch.cancelled" and event["data"] == {"id": batch["id"]}
        ids.add(event["id"])
    assert len(ids) == 1  # one event, the same id at every endpoint
    assert receiver.requests(removed) == []


def test_failed_and_expired_batches_send_their_events(make_server, engine_url: str, receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver), env=FAST,
                         args=("--no-worker", "--window-seconds", "1"))
    hook = name()
    added = server.admin("webhook", "add", "--org", "default", "--url", receiver.url(hook),
                         "--catalog", str(server.data_dir / "catalog.toml"))
    assert added.returncode == 0, added.stderr
    secret = added.stdout.strip()
    embed = create(server, [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                             "body": {"model": "test/embed", "input": "orphaned"}}], endpoint="/v1/embeddings")
    late = create(server, [chat("l", "never in time")])
    wait_for(lambda: time.time() >= late["expires_at"] + 1, "the window to close", timeout=10)
    server.stop()
    catalog = server.data_dir / "catalog.toml"
    text = catalog.read_text()
    catalog.write_text(text[:text.index('[[models]]\nname = "test/embed"')] + text[text.index("[tools]"):])
    server.args.remove("--no-worker")
    server.start()
    assert server.wait(embed["id"])["status"] == "failed"
    assert server.wait(late["id"])["status"] == "expired"
    got = receiver.wait_for(hook, lambda r: len(r) == 2, "two events")
    events = {verified(secret, r)["data"]["id"]: verified(secret, r)["type"] for r in got}
    assert events == {embed["id"]: "batch.failed", late["id"]: "batch.expired"}


# -- retries, giving up, the log ----------------------------------------------------------------------------------


def test_a_failing_receiver_gets_the_event_again_with_backoff(org: Server, receiver: Receiver) -> None:
    hook = name()
    made = register(org, receiver.url(hook))
    receiver.fail(hook, 3, status=503)
    batch = create(org, [chat("r", "retry me")])
    assert org.wait(batch["id"])["status"] == "completed"
    got = receiver.wait_for(hook, lambda r: len(r) == 4 and r[-1]["answered"] == 200, "the fourth attempt")
    assert [r["answered"] for r in got] == [503, 503, 503, 200]
    events = [verified(made["secret"], r) for r in got]  # each attempt signed anew, all verify
    assert len({e["id"] for e in events}) == 1 and {r["headers"]["webhook-id"] for r in got} == {events[0]["id"]}
    assert len({r["body"] for r in got}) == 1  # the same bytes every time
    # Waits of at least 0.2, 0.4 and 0.8 s between attempts (the backoff doubles).
    gaps = [b["received_at"] - a["received_at"] for a, b in zip(got, got[1:], strict=False)]
    assert all(gap >= floor for gap, floor in zip(gaps, (0.2, 0.4, 0.8), strict=True)), gaps

    log = wait_for(lambda: len(found := delivery_log(org, "--endpoint", made["id"])) == 4 and found,
                   "four attempts in the log")
    assert [a["attempt"] for a in log] == [4, 3, 2, 1]  # newest first
    assert [(a["outcome"], a["status_code"]) for a in log] == [("delivered", 200)] + [("failed", 503)] * 3
    assert {a["event_id"] for a in log} == {events[0]["id"]} and {a["batch_id"] for a in log} == {batch["id"]}
    assert {a["delivery_state"] for a in log} == {"delivered"} and {a["org_id"] for a in log} == {log[0]["org_id"]}
    assert log[1]["error"] == "the endpoint answered 503" and log[0]["error"] is None
    assert delivery_log(org, "--event", events[0]["id"]) == log
    metrics = http_client.get(org.base_url.removesuffix("/v1") + "/metrics", timeout=30).text.splitlines()  # all tests'
    counted = {o: float(next(line.split()[-1] for line in metrics
                             if line.startswith(f'openrelay_webhook_attempts_total{{outcome="{o}"}}')))
               for o in ("delivered", "failed")}
    assert counted["delivered"] >= 1 and counted["failed"] >= 3


def test_delivery_gives_up_after_its_window(make_server, engine_url: str, receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver),
                         env={**FAST, "OPENRELAY_WEBHOOK_GIVE_UP_SECONDS": "1"})
    hook = name()
    made = register(server, receiver.url(hook))
    receiver.fail(hook, 1000)
    batch = create(server, [chat("g", "nobody listens")])
    assert server.wait(batch["id"])["status"] == "completed"
    log = wait_for(lambda: (found := delivery_log(server, "--endpoint", made["id"]))
                   and found[0]["delivery_state"] == "failed" and found, "the delivery to be given up")
    # Waits of 0.2 and 0.4 s fit in the 1 s window, the 0.8 s after the third attempt does not: at most three.
    assert 1 <= len(log) <= 3 and {a["outcome"] for a in log} == {"failed"}
    assert len(receiver.requests(hook)) == len(log)


def test_a_name_that_resolves_to_loopback_is_refused_at_delivery(org: Server, receiver: Receiver) -> None:
    # Registered by name (judged when it is resolved): localhost is not what the allow entry names.
    hook = name()
    made = register(org, f"http://localhost:{receiver.port}/hooks/{hook}")
    batch = create(org, [chat("n", "where to?")])
    assert org.wait(batch["id"])["status"] == "completed"
    log = wait_for(lambda: delivery_log(org, "--endpoint", made["id"]), "an attempt in the log")
    assert log[-1]["outcome"] == "refused" and log[-1]["status_code"] is None
    assert "loopback or private" in log[-1]["error"] and "[webhooks] allow" in log[-1]["error"]
    assert receiver.requests(hook) == []


# -- orl admin webhook --------------------------------------------------------------------------------------------


def test_admin_webhook_commands(org: Server, receiver: Receiver) -> None:
    hook, failing = name(), name()
    catalog = str(org.data_dir / "catalog.toml")
    added = org.admin("webhook", "add", "--org", org.org, "--url", receiver.url(hook), "--catalog", catalog)
    assert added.returncode == 0, added.stderr
    secret = added.stdout.strip()
    assert added.stdout == secret + "\n" and secret.startswith("whsec_")  # only the secret on stdout
    listed = json.loads(org.admin("webhook", "list", "--org", org.org).stdout)
    assert len(listed) == 1 and listed[0]["url"] == receiver.url(hook) and listed[0]["org"] == org.org
    assert secret not in json.dumps(listed) and "secret" not in listed[0]
    endpoint_id = listed[0]["id"]
    assert endpoint_id in added.stderr
    # The API sees the operator's endpoint as the organization's own.
    assert [e["id"] for e in org.http("GET", "/webhooks").json()["data"]] == [endpoint_id]

    tested = org.admin("webhook", "test", endpoint_id, "--catalog", catalog)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    attempt = json.loads(tested.stdout)
    assert attempt["outcome"] == "delivered" and attempt["status_code"] == 200
    event = verified(secret, receiver.requests(hook)[-1])
    assert event["type"] == "webhook.test" and event["data"] == {"id": endpoint_id}
    assert event["id"] == attempt["event_id"]
    assert delivery_log(org, "--event", attempt["event_id"])[0]["type"] == "webhook.test"

    # A failing endpoint: the test says so (exit 1) and is not retried.
    added = org.admin("webhook", "add", "--org", org.org, "--url", receiver.url(failing), "--catalog", catalog)
    failing_id = next(e["id"] for e in json.loads(org.admin("webhook", "list", "--org", org.org).stdout)
                      if e["url"] == receiver.url(failing))
    receiver.fail(failing, 1, status=418)
    tested = org.admin("webhook", "test", failing_id, "--catalog", catalog)
    assert tested.returncode == 1
    assert json.loads(tested.stdout)["status_code"] == 418
    assert json.loads(tested.stdout)["delivery_state"] == "failed"

    removed = org.admin("webhook", "remove", endpoint_id)
    assert removed.returncode == 0 and json.loads(removed.stdout)["removed"] is True
    assert org.admin("webhook", "remove", endpoint_id).returncode == 4
    assert org.admin("webhook", "test", endpoint_id).returncode == 4
    assert [e["id"] for e in json.loads(org.admin("webhook", "list", "--org", org.org).stdout)] == [failing_id]


def test_admin_refuses_what_the_api_refuses(org: Server, receiver: Receiver) -> None:
    for url in ("http://169.254.169.254/", "ftp://hooks.example.com/"):
        refused = org.admin("webhook", "add", "--org", org.org, "--url", url)
        assert refused.returncode == 2 and refused.stdout == "", refused
    # Without --catalog the built-in catalog rules: it allows no loopback address.
    refused = org.admin("webhook", "add", "--org", org.org, "--url", receiver.url("x"))
    assert refused.returncode == 2 and "[webhooks] allow" in refused.stderr
    assert org.admin("webhook", "add", "--org", "no-such-org", "--url", "https://h.example.com/").returncode == 4


def test_events_keep_coming_while_other_batches_run(org: Server, receiver: Receiver) -> None:
    """Many batches, each its own event: none lost, none twice (the receiver answers at once)."""
    hook = name()
    secret = register(org, receiver.url(hook))["secret"]
    ids = [create(org, [chat(f"m{i}", f"batch {i}")])["id"] for i in range(6)]
    for batch_id in ids:
        assert org.wait(batch_id)["status"] == "completed"
    got = receiver.wait_for(hook, lambda r: len(r) >= 6, "six events")
    by_batch: dict[str, set[str]] = {}
    for request in got:
        event = verified(secret, request)
        by_batch.setdefault(event["data"]["id"], set()).add(event["id"])
    assert sorted(by_batch) == sorted(ids) and all(len(v) == 1 for v in by_batch.values())
    assert get(org, ids[0])["status"] == "completed"
