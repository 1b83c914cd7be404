"""Managing webhook endpoints after they are made (issue 25), end to end against a real receiver process: secret
rotation (both secrets verify with the `standardwebhooks` package during the overlap, only the new one after),
event filters, an endpoint's deliveries, replays of delivered and given-up deliveries, and the workers pruning
the delivery log.

The store's side of each is in tests/unit/test_webhooks_store.py.
"""

from __future__ import annotations

import json
import time

import pytest
from schemathesis import checks as st_checks
from standardwebhooks import WebhookVerificationError

from tests.support.batches import chat, create, wait_for
from tests.support.server import Server
from tests.support.test_engine import EngineControl
from tests.support.webhook_fixtures import FAST, hook_catalog
from tests.support.webhook_receiver import Receiver
from tests.test_openapi import CHECKS
from tests.test_webhooks import SCHEMA, delivery_log, name, register, verified

OVERLAP = "OPENRELAY_WEBHOOK_ROTATION_OVERLAP_SECONDS"


def completed_batch(server: Server, custom_id: str) -> str:
    batch = create(server, [chat(custom_id, f"hello {custom_id}")])
    assert server.wait(batch["id"])["status"] == "completed"
    return batch["id"]


def signatures(request: dict) -> list[str]:
    return request["headers"]["webhook-signature"].split(" ")


# -- rotation -----------------------------------------------------------------------------------------------------


def test_both_secrets_verify_during_the_overlap_and_only_the_new_one_after(make_server, engine_url: str,
                                                                            receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver), env={**FAST, OVERLAP: "3600"})
    hook = name()
    made = register(server, receiver.url(hook))
    old = made["secret"]
    answer = server.http("POST", f"/webhooks/{made['id']}/rotate")
    assert answer.status_code == 200, answer.text
    rotated = answer.json()
    new = rotated["secret"]
    assert new.startswith("whsec_") and new != old
    assert {k: v for k, v in rotated.items() if k not in ("secret", "previous_secret_expires_at")} == {
        k: v for k, v in made.items() if k != "secret"}
    assert abs(rotated["previous_secret_expires_at"] - (time.time() + 3600)) < 60
    assert [e["id"] for e in server.http("GET", "/webhooks").json()["data"]] == [made["id"]]  # the same endpoint

    during = completed_batch(server, "during")
    [got] = receiver.wait_for(hook, lambda r: len(r) == 1, "the event during the overlap")
    assert len(signatures(got)) == 2  # one per secret, space-separated
    assert verified(old, got) == verified(new, got) and verified(new, got)["data"] == {"id": during}
    for secret in (old, new):  # the OpenAI SDK's verification takes either too
        assert server.client().webhooks.unwrap(got["body"], got["headers"], secret=secret).data.id == during

    # The same rotation, once its overlap is over: the workers, restarted with a 1 s overlap, judge it by the
    # database's clock and sign with the new secret alone.
    rotated_at = rotated["previous_secret_expires_at"] - 3600
    wait_for(lambda: [a["delivery_state"] for a in delivery_log(server, "--endpoint", made["id"])] == ["delivered"],
             "the delivery to be recorded (else the restarted server sends it again)")
    server.stop()
    server.env[OVERLAP] = "1"
    server.start()
    wait_for(lambda: time.time() > rotated_at + 2, "the shortened overlap to pass", timeout=10)
    after = completed_batch(server, "after")
    got = receiver.wait_for(hook, lambda r: len(r) == 2, "the event after the overlap")[1]
    assert len(signatures(got)) == 1
    assert verified(new, got)["data"] == {"id": after}
    with pytest.raises(WebhookVerificationError):
        verified(old, got)


def test_orl_admin_webhook_rotate(org: Server, receiver: Receiver) -> None:
    hook = name()
    catalog = str(org.data_dir / "catalog.toml")
    made = register(org, receiver.url(hook))
    first = org.admin("webhook", "rotate", made["id"])
    assert first.returncode == 0, first.stderr
    second_secret = first.stdout.strip()
    assert first.stdout == second_secret + "\n" and second_secret.startswith("whsec_")  # only the secret
    assert made["id"] in first.stderr and second_secret not in first.stderr
    tested = org.admin("webhook", "test", made["id"], "--catalog", catalog)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    got = receiver.requests(hook)[-1]
    assert verified(made["secret"], got)["type"] == verified(second_secret, got)["type"] == "webhook.test"

    # A second rotation during the overlap: the newest and the one it replaced sign, the first no longer does.
    third_secret = org.admin("webhook", "rotate", made["id"]).stdout.strip()
    assert org.admin("webhook", "test", made["id"], "--catalog", catalog).returncode == 0
    got = receiver.requests(hook)[-1]
    assert verified(third_secret, got) == verified(second_secret, got)
    with pytest.raises(WebhookVerificationError):
        verified(made["secret"], got)
    assert org.admin("webhook", "rotate", "wh_0000000000000000").returncode == 4


def test_rotate_refusals(org: Server, receiver: Receiver) -> None:
    made = register(org, receiver.url(name()))
    other = org.for_new_org()
    assert other.http("POST", f"/webhooks/{made['id']}/rotate").json()["error"]["code"] == "not_found"
    assert org.http("POST", "/webhooks/wh_0000000000000000/rotate").status_code == 404
    refused = org.http("POST", f"/webhooks/{made['id']}/rotate", json={"grace_seconds": 5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "grace_seconds"
    reader = org.new_org_key(None, "--scopes", "batch.read")
    assert org.http("POST", f"/webhooks/{made['id']}/rotate", api_key=reader).status_code == 403
    assert org.http("POST", f"/webhooks/{made['id']}/rotate", json={}).status_code == 200  # an empty object is none


# -- event filters ------------------------------------------------------------------------------------------------


def test_endpoints_get_only_the_event_types_they_subscribe_to(org: Server, receiver: Receiver,
                                                              engine: EngineControl) -> None:
    done, cancelled, every = name(), name(), name()
    answer = org.http("POST", "/webhooks", json={"url": receiver.url(done),
                                                 "events": ["batch.failed", "batch.completed"]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["events"] == ["batch.completed", "batch.failed"]
    secrets_by_hook = {done: answer.json()["secret"]}
    added = org.admin("webhook", "add", "--org", org.org, "--url", receiver.url(cancelled), "--events",
                      "batch.cancelled", "--catalog", str(org.data_dir / "catalog.toml"))
    assert added.returncode == 0, added.stderr
    secrets_by_hook[cancelled] = added.stdout.strip()
    secrets_by_hook[every] = register(org, receiver.url(every))["secret"]
    listed = {e["url"]: e["events"] for e in org.http("GET", "/webhooks").json()["data"]}
    assert listed == {receiver.url(done): ["batch.completed", "batch.failed"],
                      receiver.url(cancelled): ["batch.cancelled"],
                      receiver.url(every): ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]}

    completed = completed_batch(org, "f1")
    gate = f"filter-{done}"
    held = create(org, [chat("f2", f"held #hold={gate}")])
    engine.wait_held(gate)
    assert org.http("POST", f"/batches/{held['id']}/cancel").status_code == 200
    engine.release(gate)
    assert org.wait(held["id"])["status"] == "cancelled"

    got = receiver.wait_for(every, lambda r: len(r) == 2, "both events at the endpoint that takes every type")
    types = {verified(secrets_by_hook[every], r)["data"]["id"]: verified(secrets_by_hook[every], r)["type"]
             for r in got}
    assert types == {completed: "batch.completed", held["id"]: "batch.cancelled"}
    [to_done] = receiver.wait_for(done, lambda r: len(r) == 1, "the completed event")
    [to_cancelled] = receiver.wait_for(cancelled, lambda r: len(r) == 1, "the cancelled event")
    assert verified(secrets_by_hook[done], to_done)["data"] == {"id": completed}
    assert verified(secrets_by_hook[cancelled], to_cancelled)["data"] == {"id": held["id"]}
    # Not later either: an event's deliveries are all written with it, and these two have none.
    for hook, event in ((done, to_cancelled), (cancelled, to_done)):
        logged = delivery_log(org, "--event", event["headers"]["webhook-id"])
        assert receiver.url(hook) not in {a["url"] for a in logged}
    assert len(receiver.requests(done)) == len(receiver.requests(cancelled)) == 1


@pytest.mark.parametrize("events", [[], ["batch.done"], "batch.completed", [7], None])
def test_unknown_event_types_are_refused(org: Server, events: object) -> None:
    answer = org.http("POST", "/webhooks", json={"url": "https://hooks.example.com/f", "events": events})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "events" and "event type" in error["message"]


def test_unusable_addresses_are_refused_at_registration(org: Server, receiver: Receiver) -> None:
    """Forms of the receiver's own loopback address that no delivery can use (issue 34 part 6), although the
    catalog's [webhooks] allow lets 127.0.0.1 on this port be reached: 400 naming url, nothing registered."""
    port = receiver.base.rsplit(":", 1)[1]
    before = org.http("GET", "/webhooks").json()["data"]
    for host in ("[::127.0.0.1]", "127.000.000.001", "127.1", "0x7f.0.0.1", "2130706433", "0177.0.0.1",
                 "127.0.0.1.", "[::]", "0.0.0.0", "224.0.0.1", "[ff02::1]", "240.0.0.1", "[2002::]"):
        answer = org.http("POST", "/webhooks", json={"url": f"http://{host}:{port}/hooks/x"})
        assert answer.status_code == 400, (host, answer.text)
        assert answer.json()["error"]["param"] == "url", host
        refused = org.admin("webhook", "add", "--org", org.org, "--url", f"http://{host}:{port}/hooks/x")
        assert refused.returncode == 2 and refused.stdout == "", (host, refused)
    assert org.http("GET", "/webhooks").json()["data"] == before
    assert org.http("POST", "/webhooks", json={"url": receiver.url("usual-form")}).status_code == 200


def test_admin_refuses_unknown_event_types(org: Server) -> None:
    refused = org.admin("webhook", "add", "--org", org.org, "--url", "https://hooks.example.com/f", "--events",
                        "batch.completed,batch.nope")
    assert refused.returncode == 2 and "batch.nope" in refused.stderr and refused.stdout == ""


# -- replay -------------------------------------------------------------------------------------------------------


def test_a_delivered_event_is_replayed_with_the_same_webhook_id(org: Server, receiver: Receiver) -> None:
    hook = name()
    made = register(org, receiver.url(hook))
    batch_id = completed_batch(org, "r1")
    [first] = receiver.wait_for(hook, lambda r: len(r) == 1, "the event")
    [logged] = wait_for(lambda: delivery_log(org, "--endpoint", made["id"]), "the attempt in the log")
    assert logged["delivery_id"].startswith("whd_") and logged["delivery_state"] == "delivered"
    # The organization finds it through the API too.
    listed = org.http("GET", f"/webhooks/{made['id']}/deliveries").json()
    assert listed["has_more"] is False and [d["id"] for d in listed["data"]] == [logged["delivery_id"]]
    delivery = listed["data"][0]
    assert (delivery["event_id"], delivery["type"], delivery["batch_id"], delivery["state"], delivery["attempts"]) == (
        logged["event_id"], "batch.completed", batch_id, "delivered", 1)
    assert delivery["next_attempt_at"] is None and delivery["delivered_at"] >= delivery["created_at"] - 1

    answer = org.http("POST", f"/webhooks/deliveries/{logged['delivery_id']}/replay")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"id": logged["delivery_id"], "object": "webhook_delivery",
                             "event_id": logged["event_id"], "endpoint_id": made["id"], "state": "pending",
                             "previous_state": "delivered", "attempts": 1}
    second = receiver.wait_for(hook, lambda r: len(r) == 2, "the replayed event")[1]
    assert second["headers"]["webhook-id"] == first["headers"]["webhook-id"] == logged["event_id"]
    assert second["body"] == first["body"]
    assert verified(made["secret"], second)["id"] == logged["event_id"]
    log = wait_for(lambda: len(found := delivery_log(org, "--endpoint", made["id"])) == 2 and found,
                   "the replay's attempt in the log")
    assert [(a["attempt"], a["outcome"]) for a in log] == [(2, "delivered"), (1, "delivered")]


def test_a_given_up_delivery_is_replayed_by_the_operator(make_server, engine_url: str, receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver),
                         env={**FAST, "OPENRELAY_WEBHOOK_GIVE_UP_SECONDS": "1"})
    hook = name()
    made = register(server, receiver.url(hook))
    receiver.fail(hook, 1000)
    completed_batch(server, "g1")
    log = wait_for(lambda: (found := delivery_log(server, "--endpoint", made["id"]))
                   and found[0]["delivery_state"] == "failed" and found, "the delivery to be given up")
    receiver.fail(hook, 0)  # the receiver is back

    replayed = server.admin("webhook", "replay", log[0]["delivery_id"])
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["previous_state"] == "failed"
    got = receiver.wait_for(hook, lambda r: r[-1]["answered"] == 200, "the replayed event")
    assert {r["headers"]["webhook-id"] for r in got} == {log[0]["event_id"]}
    assert verified(made["secret"], got[-1])["type"] == "batch.completed"
    after = wait_for(lambda: (found := delivery_log(server, "--endpoint", made["id"]))
                     and found[0]["outcome"] == "delivered" and found, "the replay's attempt in the log")
    assert after[0]["attempt"] == len(log) + 1 and after[0]["delivery_state"] == "delivered"


def test_deliveries_are_listed_newest_first_page_by_page(org: Server, receiver: Receiver) -> None:
    hook = name()
    made = register(org, receiver.url(hook))
    older, newer = completed_batch(org, "l1"), completed_batch(org, "l2")
    receiver.wait_for(hook, lambda r: len(r) == 2, "both events")
    path = f"/webhooks/{made['id']}/deliveries"
    first = org.http("GET", path, params={"limit": 1}).json()
    assert first["has_more"] is True and [d["batch_id"] for d in first["data"]] == [newer]
    second = org.http("GET", path, params={"limit": 1, "after": first["last_id"]}).json()
    assert second["has_more"] is False and [d["batch_id"] for d in second["data"]] == [older]
    for params, status in (({"limit": 0}, 400), ({"limit": 101}, 400), ({"limit": "many"}, 400),
                           ({"after": "whd_nope"}, 404)):
        assert org.http("GET", path, params=params).status_code == status, params
    assert org.for_new_org().http("GET", path).status_code == 404  # another organization's endpoint
    reader = org.new_org_key(None, "--scopes", "batch.read")
    assert org.http("GET", path, api_key=reader).status_code == 403


def test_the_new_routes_answer_as_documented(org: Server, receiver: Receiver) -> None:
    def call(method: str, path: str, expect: int, **case: object) -> dict:
        response = SCHEMA[path][method].Case(**case).call_and_validate(
            base_url=org.base_url.removesuffix("/v1"), headers={"Authorization": f"Bearer {org.api_key}"},
            checks=[getattr(st_checks, check) for check in CHECKS])
        assert response.status_code == expect, response.text
        return response.json()

    made = call("POST", "/v1/webhooks", 200, body={"url": receiver.url(name()), "events": ["batch.completed"]})
    call("POST", "/v1/webhooks", 400, body={"url": receiver.url(name()), "events": ["nope"]})
    endpoint = {"webhook_id": made["id"]}
    call("POST", "/v1/webhooks/{webhook_id}/rotate", 200, path_parameters=endpoint)
    call("POST", "/v1/webhooks/{webhook_id}/rotate", 404, path_parameters={"webhook_id": "wh_\x00"})
    completed_batch(org, "d1")
    listed = wait_for(lambda: (page := call("GET", "/v1/webhooks/{webhook_id}/deliveries", 200,
                                            path_parameters=endpoint))["data"] and page, "the delivery")
    call("GET", "/v1/webhooks/{webhook_id}/deliveries", 400, path_parameters=endpoint, query={"limit": 0})
    replay = "/v1/webhooks/deliveries/{delivery_id}/replay"
    call("POST", replay, 200, path_parameters={"delivery_id": listed["data"][0]["id"]})
    call("POST", replay, 404, path_parameters={"delivery_id": "whd_\x00"})


def test_replay_refusals(org: Server, receiver: Receiver) -> None:
    made = register(org, receiver.url(name()))
    completed_batch(org, "x1")
    [logged] = wait_for(lambda: delivery_log(org, "--endpoint", made["id"]), "the attempt in the log")
    path = f"/webhooks/deliveries/{logged['delivery_id']}/replay"
    assert org.for_new_org().http("POST", path).status_code == 404  # another organization's
    assert org.http("POST", "/webhooks/deliveries/whd_nope/replay").status_code == 404
    assert org.admin("webhook", "replay", "whd_nope").returncode == 4
    refused = org.http("POST", path, json={"now": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "now"
    assert org.http("DELETE", f"/webhooks/{made['id']}").status_code == 200
    gone = org.http("POST", path)
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "webhook_endpoint_removed"


# -- pruning ------------------------------------------------------------------------------------------------------


def test_the_workers_prune_the_log_of_finished_deliveries(make_server, engine_url: str, receiver: Receiver) -> None:
    server = make_server(catalog=hook_catalog(engine_url, receiver),
                         env={**FAST, "OPENRELAY_WEBHOOK_LOG_KEEP_SECONDS": "1"})
    hook = name()
    made = register(server, receiver.url(hook))
    receiver.fail(hook, 1000)
    completed_batch(server, "p1")
    # Still being retried: its log stays, however old (a prune runs every second here).
    first = wait_for(lambda: delivery_log(server, "--endpoint", made["id"]), "an attempt in the log")[-1]
    wait_for(lambda: len(delivery_log(server, "--endpoint", made["id"])) >= 4, "attempts over more than 1 s")
    assert delivery_log(server, "--endpoint", made["id"])[-1] == first

    receiver.fail(hook, 0)
    receiver.wait_for(hook, lambda r: r[-1]["answered"] == 200, "the delivery")
    wait_for(lambda: delivery_log(server, "--endpoint", made["id"]) == [], "the finished delivery's log to go")
    assert server.admin("webhook", "replay", first["delivery_id"]).returncode == 4  # the delivery is gone too


def test_retention_keeps_a_batch_until_its_webhook_is_delivered(make_server, engine_url: str,
                                                                 receiver: Receiver) -> None:
    # Polls read the store each time: a batch pruned within 0.25 s of its end could otherwise be seen only before it
    # ended (a poll's answer is kept that long, api/poll_cache.py).
    server = make_server(catalog=hook_catalog(engine_url, receiver), args=("--retention-days", "0"),
                         env={**FAST, "OPENRELAY_SWEEP_SECONDS": "0.2", "OPENRELAY_POLL_CACHE_SECONDS": "0"})
    hook = name()
    register(server, receiver.url(hook))
    receiver.fail(hook, 10 ** 6)
    owed = completed_batch(server, "owed")
    receiver.wait_for(hook, lambda got: len(got) >= 2, "the event being retried")
    other = server.for_new_org()  # no endpoint: its batch owes nothing
    ended_after = create(other, [chat("other", "hello other")])["id"]  # pruned as soon as it ends: wait for that
    wait_for(lambda: other.http("GET", f"/batches/{ended_after}").status_code == 404, "the sweeper to prune it")
    assert server.http("GET", f"/batches/{owed}").status_code == 200  # ended first, kept for its webhook
    receiver.fail(hook, 0)  # the receiver is back: once the event is delivered, the batch goes
    receiver.wait_for(hook, lambda got: got[-1]["answered"] == 200, "the delivery")
    wait_for(lambda: server.http("GET", f"/batches/{owed}").status_code == 404, "the delivered batch to be pruned")
