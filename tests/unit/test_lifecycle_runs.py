"""A batch's lifecycle, run by real workers on a real store (docs/guarantees.md, CONTRACT section 7): how it ends
(completed, cancelled before or during its run, expired, failed by its failure_threshold or by a model that left the
catalog), a worker that drains and another that resumes, and `request_counts.completed + failed == total` with one
line per record at every end. The engine is replaced at its boundary (tests/support/relay.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from openrelay import clock
from openrelay.blobs.keys import file_key
from openrelay.engines.base import EngineReply
from tests.support.batches import batch_usage, chat, create, embed, error_of, get, results, usage_of
from tests.support.mock_engine import EngineRequest, echo, reply, text_of
from tests.support.polling import wait_for_async
from tests.support.relay import ENGINE_URL, Relay
from tests.support.server import catalog_text

ONE_LANE = catalog_text(ENGINE_URL, concurrency=1)  # one record at a time: which ones ran is exact


def records(count: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [chat(f"{prefix}{i}", f"{prefix} question {i}") for i in range(count)]


def ended(relay: Relay, batch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict], dict[str, dict]]:
    """The batch as the API shows it now, with its output and error lines; one line per record, counts that add
    up (checked)."""
    done = get(relay, batch["id"])
    out, err = results(relay, done)
    counts = done["request_counts"]
    assert counts["completed"] + counts["failed"] == counts["total"] == len(out) + len(err), done
    return done, out, err


def codes(err: dict[str, dict]) -> dict[str, str]:
    return {cid: line["error"]["code"] for cid, line in err.items()}


def test_a_completed_batch_has_its_times_files_counts_and_usage(relay: Relay) -> None:
    batch = create(relay, records(5))
    assert batch["status"] == "validating" and batch["in_progress_at"] is None
    relay.run_until_idle()
    done, out, err = ended(relay, batch)
    assert done["status"] == "completed" and err == {} and sorted(out) == [f"r{i}" for i in range(5)]
    assert done["created_at"] <= done["in_progress_at"] <= done["finalizing_at"] <= done["completed_at"]
    assert done["output_file_id"] == f"file-{batch['id']}-output" and done["error_file_id"] is None
    assert done["usage"] == usage_of(out) and done["usage"]["cost_nano_usd"] > 0
    assert out["r3"]["response"]["body"]["choices"][0]["message"]["content"] == "echo: r question 3"


def test_the_engine_gets_the_records_body_and_users_see_the_catalogs_model_name(relay: Relay) -> None:
    def served_name(request: EngineRequest) -> EngineReply:
        answer = echo(request)
        answer.body["model"] = "google/gemma-served"  # what an engine calls the model it serves
        return answer

    relay.handler = served_name
    batch = create(relay, [chat("a", "hi", temperature=0.5, max_tokens=7)])
    relay.run_until_idle()
    (request,) = relay.requests()
    assert request.endpoint == "/v1/chat/completions"
    assert request.body == {"model": "test/echo", "messages": [{"role": "user", "content": "hi"}],
                            "temperature": 0.5, "max_tokens": 7}
    _done, out, _err = ended(relay, batch)
    assert out["a"]["response"]["body"]["model"] == "test/echo"
    assert re.fullmatch(r"[0-9a-f]{32}", out["a"]["response"]["request_id"])


def test_an_expedited_batch_costs_its_tiers_factor(relay: Relay) -> None:
    standard = create(relay, records(3))
    expedited = create(relay, records(3), priority="expedited")
    relay.run_until_idle()
    cheap, out, _ = ended(relay, standard)
    dear, out_e, _ = ended(relay, expedited)
    assert cheap["usage"] == usage_of(out) and dear["usage"] == usage_of(out_e, "expedited")
    assert dear["usage"]["cost_nano_usd"] * 2 == cheap["usage"]["cost_nano_usd"] * 3  # 0.75 against 0.5


def test_embeddings_and_completions_batches_run_on_their_endpoints(relay: Relay) -> None:
    vectors = create(relay, [embed(f"e{i}", f"text {i}", model="test/embed") for i in range(3)],
                     endpoint="/v1/embeddings")
    prompts = create(relay, [{"custom_id": "c", "method": "POST", "url": "/v1/completions",
                              "body": {"model": "test/echo", "prompt": "once upon"}}], endpoint="/v1/completions")
    relay.run_until_idle()
    done, out, _ = ended(relay, vectors)
    assert done["status"] == "completed" and out["e1"]["response"]["body"]["data"][0]["embedding"] == [0.5, -0.5]
    assert done["usage"] == batch_usage(6, 0, done["usage"]["cost_nano_usd"])
    done, out, _ = ended(relay, prompts)
    assert done["status"] == "completed" and out["c"]["response"]["body"]["choices"][0]["text"] == "echo: once upon"
    assert {r.endpoint for r in relay.requests()} == {"/v1/embeddings", "/v1/completions"}


def test_records_the_create_rejected_get_their_lines_in_the_error_file(relay: Relay) -> None:
    bad = chat("no-model", "x")
    del bad["body"]["model"]
    streaming = chat("streaming", "x", stream=True)
    batch = create(relay, [chat("ok", "fine"), bad, streaming])
    assert batch["rejected_count"] == 2
    relay.run_until_idle()
    done, out, err = ended(relay, batch)
    assert done["status"] == "completed" and sorted(out) == ["ok"]
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert err["streaming"]["error"]["code"] == "streaming_unsupported"
    assert err["no-model"]["error"]["code"] == "missing_model"
    assert err["no-model"]["error"]["message"].startswith("line 2: ")
    assert [r.body["messages"][0]["content"] for r in relay.requests()] == ["fine"]


def test_a_batch_cancelled_before_it_ran_sends_nothing(relay: Relay) -> None:
    batch = create(relay, records(4))
    cancelling = relay.http("POST", f"/batches/{batch['id']}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    relay.run_until_idle()
    done, out, err = ended(relay, batch)
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None and out == {}
    assert set(codes(err).values()) == {"batch_cancelled"} and len(err) == 4
    assert relay.requests() == [] and done["usage"] == batch_usage()


def test_a_cancel_during_the_run_finishes_the_record_in_flight_and_starts_no_other(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=ONE_LANE) as relay:
        batch = create(relay, records(8))

        async def cancel_at_the_third(request: EngineRequest) -> EngineReply:
            if text_of(request) == "r question 2":
                assert relay.http("POST", f"/batches/{batch['id']}/cancel").status_code == 200
                await wait_for_async(lambda: f"batch {batch['id']}: cancelling" in relay.log(),
                                     "the worker to see the cancel")
            return echo(request)

        relay.handler = cancel_at_the_third
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == "cancelled"
        assert sorted(out) == ["r0", "r1", "r2"]  # the third was in flight: it finishes and keeps its line
        assert codes(err) == {f"r{i}": "batch_cancelled" for i in range(3, 8)}
        assert len(relay.requests()) == 3 and done["usage"] == usage_of(out)


def test_an_ended_batch_cannot_be_cancelled(relay: Relay) -> None:
    batch = create(relay, records(1))
    relay.run_until_idle()
    error_of(relay.http("POST", f"/batches/{batch['id']}/cancel"), 409, "batch_terminal")
    assert get(relay, batch["id"])["status"] == "completed"


def test_a_second_cancel_answers_the_batch_still_cancelling(relay: Relay) -> None:
    batch = create(relay, records(1))
    first = relay.http("POST", f"/batches/{batch['id']}/cancel").json()
    again = relay.http("POST", f"/batches/{batch['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelling"
    assert again.json()["cancelling_at"] == first["cancelling_at"]


def test_a_batch_claimed_after_its_window_expires_with_every_record_unrun(tmp_path: Path) -> None:
    with Relay(tmp_path, window_seconds=0) as relay:
        batch = create(relay, records(3))
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == "expired" and done["expired_at"] is not None and out == {}
        assert codes(err) == {f"r{i}": "batch_expired" for i in range(3)} and relay.requests() == []


def test_a_window_that_ends_during_the_run_keeps_what_finished(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with Relay(tmp_path, catalog=ONE_LANE) as relay:
        batch = create(relay, records(5))

        def window_ends_at_the_second(request: EngineRequest) -> EngineReply:
            if text_of(request) == "r question 1":  # a day passes while the engine answers it (openrelay/clock.py)
                later = time.time_ns() + (batch["expires_at"] - batch["created_at"] + 1) * 1_000_000_000
                monkeypatch.setattr(clock, "read_ns", lambda: later)
            return echo(request)

        relay.handler = window_ends_at_the_second
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == "expired" and sorted(out) == ["r0", "r1"]  # the second was in flight: it finishes
        assert codes(err) == {f"r{i}": "batch_expired" for i in range(2, 5)}


def test_a_failure_threshold_stops_the_batch_and_marks_the_rest_aborted(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=ONE_LANE) as relay:
        relay.handler = lambda request: reply(400, message="unknown parameter: temprature")
        batch = create(relay, records(10), failure_threshold={"error_rate": 0.5, "min_records": 3})
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == "failed" and done["failed_at"] is not None and out == {}
        assert [e["code"] for e in done["errors"]["data"]] == ["failure_threshold_exceeded"]
        assert codes(err) == {**{f"r{i}": "invalid_request_error" for i in range(3)},
                              **{f"r{i}": "batch_aborted" for i in range(3, 10)}}
        assert len(relay.requests()) == 3


def test_failures_under_the_threshold_let_the_batch_complete(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=ONE_LANE) as relay:
        relay.handler = lambda request: reply(400) if text_of(request).endswith(("0", "5")) else echo(request)
        batch = create(relay, records(10), failure_threshold={"error_rate": 0.5, "min_records": 3})
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == "completed" and len(out) == 8 and sorted(err) == ["r0", "r5"]


def test_a_batch_whose_model_left_the_catalog_fails_and_bills_nothing(relay: Relay) -> None:
    batch = create(relay, [embed(f"m{i}", f"orphaned {i}", model="test/embed") for i in range(2)],
                   endpoint="/v1/embeddings")
    text = relay.catalog_path.read_text()
    relay.run_with_catalog(text[:text.index('[[models]]\nname = "test/embed"')] + text[text.index("[tools]"):])
    done, out, err = ended(relay, batch)
    assert done["status"] == "failed" and done["failed_at"] is not None
    assert [e["code"] for e in done["errors"]["data"]] == ["model_unavailable"]
    assert relay.requests() == [] and done["usage"] == batch_usage() and out == {}


def test_a_draining_worker_hands_the_batch_back_and_the_next_runs_only_the_rest(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=ONE_LANE) as relay:
        batch = create(relay, records(6))

        def stop_at_the_third(request: EngineRequest) -> EngineReply:
            if text_of(request) == "r question 2" and relay.worker is not None:
                relay.worker.request_stop()  # as SIGTERM does: this record finishes, no other starts
            return echo(request)

        relay.handler = stop_at_the_third
        relay.run_until_idle()
        handed_back = get(relay, batch["id"])
        assert handed_back["status"] == "in_progress"
        assert handed_back["request_counts"] == {"total": 6, "completed": 3, "failed": 0}
        relay.handler = echo
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == "completed" and len(out) == 6 and err == {}
        assert sorted(text_of(r) for r in relay.requests()) == [f"r question {i}" for i in range(6)]  # each once


def test_retry_makes_a_batch_of_the_failed_records_that_runs(relay: Relay) -> None:
    relay.handler = lambda request: reply(400) if text_of(request) in ("r question 1", "r question 3") \
        else echo(request)
    batch = create(relay, records(5), metadata={"tags": "nightly"})
    relay.run_until_idle()
    retried = relay.http("POST", f"/batches/{batch['id']}/retry", json={})
    assert retried.status_code == 200, retried.text
    again = retried.json()
    assert again["request_counts"]["total"] == 2
    assert again["metadata"] == {"retry_of": batch["id"], "tags": "nightly"}
    relay.handler = echo
    relay.run_until_idle()
    done, out, err = ended(relay, again)
    assert done["status"] == "completed" and sorted(out) == ["r1", "r3"] and err == {}


def test_a_keys_spend_grows_as_records_complete_and_a_spent_budget_refuses_creates(relay: Relay) -> None:
    key = relay.rt.accounts.authenticate(relay.api_key)
    assert key is not None
    relay.rt.accounts.set_budget(key.id, 1)
    batch = create(relay, records(2))
    relay.run_until_idle()
    done, _, _ = ended(relay, batch)
    assert relay.rt.accounts.key(key.id).spent_nano_usd == done["usage"]["cost_nano_usd"] > 1
    refused = relay.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                   "requests": records(1)})
    error_of(refused, 402, "key_budget_exceeded", type_=refused.json()["error"]["type"])


def test_a_batch_whose_runs_keep_failing_ends_failed_after_its_attempts(tmp_path: Path) -> None:
    """Its input is gone from the blob store (a storage loss): each run fails for a reason of its own, is tried
    again after a backoff, and after ``OPENRELAY_RUN_ATTEMPTS`` the batch ends failed, every record counted."""
    with Relay(tmp_path, env={"OPENRELAY_RUN_ATTEMPTS": "2"}) as relay:
        batch = create(relay, records(3))
        (relay.settings.blob_dir / file_key(batch["input_file_id"])).unlink()
        deadline = time.monotonic() + 60  # a guard against a hang only
        while get(relay, batch["id"])["status"] != "failed" and time.monotonic() < deadline:
            relay.run_until_idle()  # a failed run waits out its backoff in the store: a burst ends before it is due
        done = get(relay, batch["id"])
        assert done["status"] == "failed" and [e["code"] for e in done["errors"]["data"]] == ["batch_run_failed"]
        assert done["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
        assert relay.log().count(f"batch {batch['id']}: run ") == 2 and relay.requests() == []


# -- the queue --------------------------------------------------------------------------------------------------

ONE_SLOT = catalog_text(ENGINE_URL, slots=1, concurrency=1)


def order_of_batches(relay: Relay) -> list[str]:
    """The batches in the order their records reached the engine (each record's custom id is batch-prefixed)."""
    seen: list[str] = []
    for request in relay.requests():
        name = text_of(request).split()[0]
        if not seen or seen[-1] != name:
            seen.append(name)
    return seen


def test_with_one_slot_batches_run_one_after_another_expedited_first(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=ONE_SLOT) as relay:
        for name, priority in (("s1", "standard"), ("s2", "standard"), ("e1", "expedited")):
            create(relay, records(2, name), priority=priority)
        relay.run_until_idle()
        assert order_of_batches(relay) == ["e1", "s1", "s2"]  # never two batches interleaved


def test_organizations_take_turns_at_a_slot(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=ONE_SLOT) as relay:
        _org, other = relay.new_org()
        for name in ("a1", "a2", "a3"):
            create(relay, records(1, name))
        create(relay, records(1, "b1"), api_key=other)
        relay.run_until_idle()
        assert order_of_batches(relay) == ["a1", "b1", "a2", "a3"]


def test_two_workers_share_the_slots_and_run_every_record_once(relay: Relay) -> None:
    made = [create(relay, records(5, f"b{n}")) for n in range(6)]
    relay.run_until_idle(workers=2)
    for batch in made:
        done, out, err = ended(relay, batch)
        assert done["status"] == "completed" and len(out) == 5
    assert len(relay.requests()) == 30 and len({text_of(r) for r in relay.requests()}) == 30


@pytest.mark.parametrize("status", ["cancelled", "expired", "failed", "completed"])
def test_every_terminal_status_keeps_its_counts_and_one_line_per_record(tmp_path: Path, status: str) -> None:
    options: dict[str, Any] = {"catalog": ONE_LANE, "window_seconds": 0 if status == "expired" else None}
    with Relay(tmp_path, **options) as relay:
        if status == "failed":
            relay.handler = lambda request: reply(500)
        fields = {"failure_threshold": {"error_rate": 0.1, "min_records": 1}} if status == "failed" else {}
        batch = create(relay, records(4), **fields)
        if status == "cancelled":
            relay.http("POST", f"/batches/{batch['id']}/cancel")
        relay.run_until_idle()
        done, out, err = ended(relay, batch)
        assert done["status"] == status and done[f"{status}_at"] is not None
        assert done["usage"] == usage_of(out)
