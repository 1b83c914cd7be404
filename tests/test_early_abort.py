"""Issue 25 part 1, the early abort: a batch created with ``failure_threshold`` stops once too many of the records
that ran failed, like a cancel (in-flight records finish, nothing new starts), and ends ``failed`` with one
``failure_threshold_exceeded`` entry; the records that never ran are ``batch_aborted`` lines and only what ran is
billed. Against real `orl serve` processes, the test engine (``#status=400`` makes a record fail at run time), the
OpenAI SDK, the CLI, the dashboard's form and a real webhook receiver."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.support.batches import (
    CHAT,
    chat,
    error_of,
    get,
    jsonl,
    post_batch,
    post_batch_from,
    prompt_text,
    results,
    usage_of,
    wait_for,
)
from tests.support.browser import signed_in_client
from tests.support.server import Server, catalog_text
from tests.support.webhook_fixtures import FAST
from tests.support.webhook_receiver import Receiver, running_receiver
from tests.test_webhooks import register, verified

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)
RUN, REJECTED, CONCURRENCY = 200, 5, 2
THRESHOLD = {"error_rate": 0.5, "min_records": 20}
STOPPED = re.compile(r"(\d+) of the 20 records that had run failed \((\d+\.\d)%\), more than the failure_threshold's "
                     r"error_rate of 0\.5 \(min_records 20\)")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def _records(tag: str) -> list[dict[str, Any]]:
    """Rejected records first (they never count), then RUN records of which nine in ten fail at run time."""
    rejected = [chat(f"{tag}-rejected-{i}", "never runs", stream=True) for i in range(REJECTED)]
    ran = [chat(f"{tag}-{i}", f"{tag} {i}" + ("" if i % 10 == 0 else " #status=400")) for i in range(RUN)]
    return rejected + ran


def test_most_records_failing_stop_the_batch_early_and_only_what_ran_is_billed(make_server, engine, engine_url,
                                                                                receiver: Receiver) -> None:
    hooks = f'\n[webhooks]\nallow = ["{receiver.base}/hooks/"]\n'
    server = make_server(catalog=catalog_text(engine_url, concurrency=CONCURRENCY, extra=hooks), env=FAST)
    hook = register(server, receiver.url("abort"))
    client = server.client()
    uploaded = client.files.create(file=("abort.jsonl", jsonl(*_records("abort"))), purpose="batch")
    made = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                 extra_body={"failure_threshold": THRESHOLD})
    assert made.status == "validating" and made.to_dict()["failure_threshold"] == THRESHOLD

    done = server.wait(made.id)
    assert done["status"] == "failed" and done["failed_at"] is not None and done["completed_at"] is None
    assert done["failure_threshold"] == THRESHOLD
    (entry,) = done["errors"]["data"]
    assert entry["code"] == "failure_threshold_exceeded", entry
    stopped = STOPPED.search(entry["message"])
    assert stopped is not None, entry["message"]
    assert int(stopped.group(1)) > 10 and float(stopped.group(2)) == round(int(stopped.group(1)) / 20 * 100, 1)

    # The engine saw the records that ran before the stop and those in flight then: far fewer than the batch has.
    calls = [prompt_text(r) for r in engine.requests() if prompt_text(r).startswith("abort ")]
    assert 20 <= len(calls) <= 20 + CONCURRENCY, len(calls)
    ran_ids = {f"abort-{text.split()[1]}" for text in calls}
    assert len(ran_ids) == len(calls)  # each record that ran was sent once

    output, errors = results(server, done)
    assert set(output) == {i for i in ran_ids if int(i.rsplit("-", 1)[1]) % 10 == 0}
    codes = collections.Counter(line["error"]["code"] for line in errors.values())
    failed_ran = len(ran_ids) - len(output)
    assert codes["batch_aborted"] == RUN - len(ran_ids)
    assert codes["streaming_unsupported"] == REJECTED
    assert sum(1 for line in errors.values() if line["error"].get("status_code") == 400) == failed_ran
    assert set(output) | set(errors) == {r["custom_id"] for r in _records("abort")}
    for custom_id, line in errors.items():
        if line["error"]["code"] == "batch_aborted":
            assert custom_id not in ran_ids and "status_code" not in line["error"]
    assert done["request_counts"] == {"total": RUN + REJECTED, "completed": len(output),
                                      "failed": len(errors)}

    # Only what ran is billed: the batch's usage is its output lines', and the key's spend is that.
    assert done["usage"] == usage_of(output) and done["usage"]["cost_nano_usd"] > 0
    listed = server.admin("key", "list", "--org", "default")
    assert listed.returncode == 0, listed.stderr
    assert sum(k["spent_nano_usd"] for k in orjson.loads(listed.stdout)) == done["usage"]["cost_nano_usd"]

    # The batch.failed event says why, signed like every event.
    (delivered,) = receiver.wait_for("abort", lambda got: len(got) >= 1, "the batch.failed event")
    event = verified(hook["secret"], delivered)
    assert event["type"] == "batch.failed" and event["data"]["id"] == made.id
    assert event["data"]["errors"]["data"] == [entry]

    # The dashboard's batch page shows the threshold and why the batch stopped.
    with signed_in_client(server) as (browser, _csrf):
        page = browser.get(f"/batches/{made.id}")
    assert page.status_code == 200
    assert 'data-threshold="error_rate">50%' in page.text and 'data-threshold="min_records">20' in page.text
    assert "failure_threshold_exceeded" in page.text


def test_a_batch_resumed_after_kill_9_counts_the_records_that_ran_before(make_server, engine) -> None:
    # Six records fail before the kill and two are in flight (held); after the restart four more failures reach
    # min_records 10. A resumed run that counted only its own records would need ten more.
    server = make_server(concurrency=CONCURRENCY)
    records = ([chat(f"early-{i}", f"crash {i} #status=400") for i in range(6)]
               + [chat(f"late-{i}", f"crash late-{i} #hold=crash #status=400") for i in range(40)])
    made = post_batch(server, requests=records, failure_threshold={"error_rate": 0.5, "min_records": 10})
    assert made.status_code == 200, made.text
    engine.wait_held("crash", CONCURRENCY)
    wait_for(lambda: get(server, made.json()["id"])["request_counts"]["failed"] == 6, "six failures durable")
    server.kill()
    engine.release("crash")
    server.start()

    done = server.wait(made.json()["id"])
    assert done["status"] == "failed", done
    assert "10 of the 10 records that had run failed (100.0%)" in done["errors"]["data"][0]["message"]
    calls = [prompt_text(r) for r in engine.requests() if prompt_text(r).startswith("crash ")]
    # 6 before the kill, 2 in flight at it (sent again after), 4 more to reach 10, and at most the other lane's one.
    assert len(calls) <= 6 + CONCURRENCY + 4 + (CONCURRENCY - 1), calls
    output, errors = results(server, done)
    codes = collections.Counter(line["error"]["code"] for line in errors.values())
    assert output == {} and codes["batch_aborted"] == len(records) - len(set(calls))
    assert done["request_counts"] == {"total": len(records), "completed": 0, "failed": len(records)}
    assert done["usage"]["cost_nano_usd"] == 0


def test_a_retry_of_the_records_it_never_ran_keeps_the_threshold(make_server, engine) -> None:
    server = make_server(concurrency=1)  # one record at a time: the first three fail, and nothing more starts
    records = [chat(f"x-{i}", f"retry {i}" + (" #status=400" if i < 3 else "")) for i in range(30)]
    made = post_batch(server, requests=records, failure_threshold={"error_rate": 0.5, "min_records": 3})
    done = server.wait(made.json()["id"])
    assert done["status"] == "failed"
    _output, errors = results(server, done)
    unrun = {custom_id for custom_id, line in errors.items() if line["error"]["code"] == "batch_aborted"}
    assert unrun == {f"x-{i}" for i in range(3, 30)}
    again = server.http("POST", f"/batches/{done['id']}/retry", json={"codes": ["batch_aborted"]})
    assert again.status_code == 200, again.text
    assert again.json()["retried_count"] == len(unrun)
    assert again.json()["failure_threshold"] == {"error_rate": 0.5, "min_records": 3}
    retried = server.wait(again.json()["id"])
    assert retried["status"] == "completed"  # what never ran succeeds: none of it carries #status=400
    assert retried["request_counts"] == {"total": len(unrun), "completed": len(unrun), "failed": 0}


def test_create_rejections_do_not_count_and_a_healthy_batch_completes(server: Server, engine) -> None:
    # 20 rejected records and 10 that succeed: counted with the rejections the rate would be 2 in 3.
    records = [chat(f"bad-{i}", stream=True) for i in range(20)] + [chat(f"ok-{i}", "fine") for i in range(10)]
    made = post_batch(server, requests=records, failure_threshold={"error_rate": 0.1, "min_records": 5})
    assert made.status_code == 200, made.text
    done = server.wait(made.json()["id"])
    assert done["status"] == "completed" and done["errors"] is None
    assert done["request_counts"] == {"total": 30, "completed": 10, "failed": 20}


def test_failures_at_the_threshold_do_not_stop_it(server: Server, engine) -> None:
    # Exactly half fail: the batch stops only when the share is over error_rate.
    records = [chat(f"r-{i}", f"half {i}" + (" #status=400" if i % 2 else "")) for i in range(10)]
    made = post_batch(server, requests=records, failure_threshold={"error_rate": 0.5, "min_records": 10})
    done = server.wait(made.json()["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 10, "completed": 5, "failed": 5}


@pytest.mark.parametrize(("threshold", "param"), [
    ({"error_rate": 1.5, "min_records": 10}, "failure_threshold.error_rate"),
    ({"error_rate": -0.1, "min_records": 10}, "failure_threshold.error_rate"),
    ({"error_rate": "0.2", "min_records": 10}, "failure_threshold.error_rate"),
    ({"error_rate": True, "min_records": 10}, "failure_threshold.error_rate"),
    ({"min_records": 10}, "failure_threshold.error_rate"),
    ({"error_rate": 0.2, "min_records": 0}, "failure_threshold.min_records"),
    ({"error_rate": 0.2, "min_records": 2.5}, "failure_threshold.min_records"),
    ({"error_rate": 0.2}, "failure_threshold.min_records"),
    ({"error_rate": 0.2, "min_records": 10, "max_cost": 5}, "failure_threshold.max_cost"),
    ([0.2, 10], "failure_threshold"),
    ("0.2", "failure_threshold"),
])
def test_invalid_thresholds_are_a_400_naming_the_field(server: Server, threshold: Any, param: str) -> None:
    answer = post_batch(server, requests=[chat("one")], failure_threshold=threshold)
    error_of(answer, 400, "invalid_request_error", param)
    assert server.http("GET", "/batches").json()["data"] == []  # nothing was created


def test_the_dry_run_echoes_it_and_the_batch_object_shows_it(server: Server) -> None:
    dry = post_batch(server, requests=[chat("one")], dry_run=True, failure_threshold=THRESHOLD)
    assert dry.status_code == 200, dry.text
    assert dry.json()["id"] is None and dry.json()["failure_threshold"] == THRESHOLD
    plain = post_batch(server, requests=[chat("one")], failure_threshold=None)
    assert plain.status_code == 200, plain.text
    assert plain.json()["failure_threshold"] is None
    assert get(server, plain.json()["id"])["failure_threshold"] is None
    made = post_batch(server, requests=[chat("two")], failure_threshold=THRESHOLD)
    listed = {b["id"]: b["failure_threshold"] for b in server.http("GET", "/batches").json()["data"]}
    assert listed == {plain.json()["id"]: None, made.json()["id"]: THRESHOLD}  # the list page's rows show it too


def test_the_cli_flags_and_the_dashboard_form_send_it(server: Server, tmp_path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(chat("one"), chat("two")))
    made = server.orl("batches", "create", "--input-file", str(path), "--abort-if-error-rate", "0.2",
                      "--abort-after", "50")
    assert made.returncode == 0, made.stderr
    assert orjson.loads(made.stdout)["failure_threshold"] == {"error_rate": 0.2, "min_records": 50}
    alone = server.orl("batches", "create", "--input-file", str(path), "--abort-if-error-rate", "0.2")
    assert alone.returncode == 2 and "--abort-after" in alone.stderr
    refused = server.orl("batches", "create", "--input-file", str(path), "--abort-if-error-rate", "2",
                         "--abort-after", "50")
    assert refused.returncode == 2 and "failure_threshold.error_rate" in refused.stderr

    file_id = post_batch_from(server, jsonl(chat("three"))).json()["input_file_id"]
    with signed_in_client(server) as (browser, csrf):
        form = {"csrf": csrf, "input_file_id": file_id, "endpoint": CHAT, "priority": "standard",
                "idempotency_key": "form-abort", "error_rate": "0.25", "min_records": "4"}
        created = browser.post("/new", data=form)
        assert created.status_code == 303, created.text[:500]
        batch_id = created.headers["location"].split("/batches/")[1].split("?")[0]
        bad = browser.post("/new", data={**form, "idempotency_key": "form-bad", "error_rate": "lots"})
    assert get(server, batch_id)["failure_threshold"] == {"error_rate": 0.25, "min_records": 4}
    assert bad.status_code == 400 and "failure_threshold.error_rate must be a number" in bad.text
