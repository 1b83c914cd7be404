"""Lifecycle corners: cancel from every live status, `failed`, and spend budgets that accrue as records finish."""

from __future__ import annotations

import json

from tests.support.batches import batch_usage, chat, create, get, prompt_text, results, usage_of, wait_for


def test_cancel_while_validating_ends_once_a_worker_runs(make_server, engine, start_worker):
    # An API-only server: nothing promotes or runs the batch, so it is `validating` until a worker comes.
    server = make_server(args=("--no-worker",))
    batch = create(server, [chat(f"v{i}", f"never sent {i}") for i in range(3)])
    assert get(server, batch["id"])["status"] == "validating"
    cancelling = server.http("POST", f"/batches/{batch['id']}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    worker = start_worker(server)
    done = server.wait(batch["id"])
    assert worker.took(batch["id"]) and worker.stop() == 0  # ended by that worker, which then drains cleanly
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    assert done["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    out, err = results(server, done)
    assert out == {} and {line["error"]["code"] for line in err.values()} == {"batch_cancelled"}
    assert engine.requests() == []


def test_cancel_while_finalizing_keeps_every_result(make_server, engine):
    server = make_server()
    batch = create(server, [chat(f"z{i}", f"finish first {i} #hold=z") for i in range(4)])
    # The output blob's name is taken by a directory: composing the output file fails and is retried every
    # tick, so the batch stays `finalizing` (a storage outage) until the way is cleared.
    blocker = server.data_dir / "blobs" / "batches" / batch["id"] / "output.jsonl"
    blocker.mkdir(parents=True)
    engine.release("z")  # the records were held until the way was blocked
    wait_for(lambda: get(server, batch["id"])["status"] == "finalizing", "the batch to reach finalizing")
    cancelling = server.http("POST", f"/batches/{batch['id']}/cancel").json()
    assert cancelling["status"] == "cancelling"
    blocker.rmdir()
    done = server.wait(batch["id"])
    assert done["status"] == "cancelled"
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    out, err = results(server, done)
    assert sorted(out) == ["z0", "z1", "z2", "z3"] and err == {}
    assert done["usage"] == usage_of(out)


def test_batch_whose_model_left_the_catalog_fails_and_bills_nothing(make_server, engine):
    server = make_server(args=("--no-worker",))
    records = [{"custom_id": f"m{i}", "method": "POST", "url": "/v1/embeddings",
                "body": {"model": "test/embed", "input": f"orphaned {i}"}} for i in range(2)]
    batch = create(server, records, endpoint="/v1/embeddings")
    server.stop()
    catalog = server.data_dir / "catalog.toml"
    text = catalog.read_text()
    catalog.write_text(text[:text.index('[[models]]\nname = "test/embed"')] + text[text.index("[tools]"):])
    server.args.remove("--no-worker")
    server.start()
    done = server.wait(batch["id"])
    assert done["status"] == "failed" and done["failed_at"] is not None
    assert done["errors"]["data"][0]["code"] == "model_unavailable"
    assert "test/embed" in done["errors"]["data"][0]["message"]
    assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    assert done["usage"] == batch_usage()
    out, err = results(server, done)
    assert out == {} and {line["error"]["code"] for line in err.values()} == {"batch_failed"}
    assert engine.requests() == []


def _key_show(server, key_id: str) -> dict:
    shown = server.admin("key", "show", key_id)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def _key_id(server, secret: str) -> str:
    keys = json.loads(server.admin("key", "list").stdout)
    return next(k["id"] for k in keys if k["prefix"] == secret[:12])


def test_spend_accrues_while_running_and_a_used_up_budget_refuses_creates(make_server, engine):
    server = make_server(concurrency=1)
    secret = server.new_org_key(None, "--budget-usd", "0.000001")  # 1,000 nano-USD
    key_id = _key_id(server, secret)
    assert _key_show(server, key_id)["spent_nano_usd"] == 0
    records = [chat(f"b{i}", f"spend some {i} #hold=spend #tokens=100") for i in range(6)]
    response = server.http("POST", "/batches", api_key=secret,
                           json={"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": records})
    assert response.status_code == 200, response.text
    batch_id = response.json()["id"]
    # Spend grows record by record while the batch still runs: one record is let through, the rest held.
    engine.wait_held("spend")
    engine.release("spend", count=1)
    partial = wait_for(lambda: (s := _key_show(server, key_id)["spent_nano_usd"]) > 0 and s, "spend to accrue")
    running = server.http("GET", f"/batches/{batch_id}", api_key=secret).json()
    assert running["status"] == "in_progress" and running["request_counts"]["completed"] == 1
    engine.release("spend")
    done = server.wait(batch_id, api_key=secret)
    assert done["status"] == "completed"
    content = server.http("GET", f"/files/{done['output_file_id']}/content", api_key=secret).content
    out = {line["custom_id"]: line for line in map(json.loads, content.splitlines())}
    assert len(out) == 6
    spent = _key_show(server, key_id)["spent_nano_usd"]
    assert partial < spent == done["usage"]["cost_nano_usd"] == usage_of(out)["cost_nano_usd"]
    assert spent > 1000  # one batch may run past what was left of the budget

    refused = server.http("POST", "/batches", api_key=secret,
                          json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                "requests": [chat("again", "more")]})
    assert refused.status_code == 402 and refused.json()["error"]["code"] == "key_budget_exceeded"
    listed = server.http("GET", "/batches", api_key=secret).json()["data"]
    assert [b["id"] for b in listed] == [batch_id]  # the refused create made nothing

    raised = server.admin("key", "set-budget", key_id, "--budget-usd", "1")
    assert raised.returncode == 0, raised.stderr
    shown = _key_show(server, key_id)
    assert shown["budget_nano_usd"] == 10**9 and shown["spent_nano_usd"] == spent  # spend is kept
    again = server.http("POST", "/batches", api_key=secret,
                        json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                              "requests": [chat("again", "more")]})
    assert again.status_code == 200, again.text

    unlimited = server.admin("key", "set-budget", key_id, "--budget-usd", "none")
    assert unlimited.returncode == 0 and _key_show(server, key_id)["budget_usd"] is None


def test_key_show_and_set_budget_refuse_bad_input(server):
    assert server.admin("key", "show", "key_nope").returncode != 0
    assert server.admin("key", "set-budget", "key_nope", "--budget-usd", "1").returncode != 0
    secret = server.new_org_key()
    key_id = _key_id(server, secret)
    for bad in ("-1", "lots", "nan"):
        done = server.admin("key", "set-budget", key_id, "--budget-usd", bad)
        assert done.returncode != 0 and bad in done.stderr
    assert _key_show(server, key_id)["budget_usd"] is None


def test_nothing_is_billed_while_queued_or_in_flight(make_server, engine):
    server = make_server(slots=1, concurrency=1)
    secret = server.new_org_key()
    key_id = _key_id(server, secret)
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
    holder = server.http("POST", "/batches", api_key=secret,
                         json={**body, "requests": [chat("h", "hold #hold=h")]}).json()
    engine.wait_held("h")
    queued = server.http("POST", "/batches", api_key=secret, json={**body, "requests": [chat("q", "wait")]}).json()
    assert server.http("GET", f"/batches/{queued['id']}", api_key=secret).json()["in_progress_at"] is None
    assert _key_show(server, key_id)["spent_nano_usd"] == 0
    # The check above ran while the holder's only record was still in flight and the other batch queued.
    assert server.http("GET", f"/batches/{holder['id']}", api_key=secret).json()["request_counts"]["completed"] == 0
    assert server.http("GET", f"/batches/{queued['id']}", api_key=secret).json()["in_progress_at"] is None
    engine.release("h")
    first = server.wait(holder["id"], api_key=secret)
    second = server.wait(queued["id"], api_key=secret)
    total = first["usage"]["cost_nano_usd"] + second["usage"]["cost_nano_usd"]
    assert _key_show(server, key_id)["spent_nano_usd"] == total > 0


def test_kill_9_keeps_queue_places_never_interrupts_and_bills_each_record_once(make_server, engine):
    server = make_server(slots=1, concurrency=2)
    secret = server.new_org_key()
    key_id = _key_id(server, secret)

    def make(prefix: str, count: int, text: str, priority: str = "standard") -> str:
        response = server.http("POST", "/batches", api_key=secret, json={
            "endpoint": "/v1/chat/completions", "completion_window": "24h", "priority": priority,
            "requests": [chat(f"{prefix}{i}", f"{text} {i}") for i in range(count)]})
        assert response.status_code == 200, response.text
        return response.json()["id"]

    running = make("a", 8, "running first #hold=a")
    engine.wait_held("a", 2)
    engine.release("a", count=2)
    wait_for(lambda: server.http("GET", f"/batches/{running}", api_key=secret).json()["request_counts"]
             ["completed"] >= 2, "the first batch to be part done")
    engine.wait_held("a", 2)  # two more in flight, held, while the others queue behind the slot
    standard = make("s", 2, "standard queued")
    expedited = make("x", 2, "expedited queued", priority="expedited")
    server.kill()
    engine.release("a")
    server.start()
    done = {b: server.wait(b, api_key=secret) for b in (running, standard, expedited)}
    assert all(b["status"] == "completed" and b["request_counts"]["failed"] == 0 for b in done.values())
    texts = [prompt_text(r) for r in engine.requests()]
    first = {p: min(i for i, t in enumerate(texts) if t.startswith(p)) for p in ("running", "expedited", "standard")}
    last_running = max(i for i, t in enumerate(texts) if t.startswith("running"))
    # The resumed batch kept its slot to the end; then the queue went on in its order, expedited first.
    assert last_running < first["expedited"] < first["standard"]
    # Every record once in its result file, billed once: the key's spend is exactly what the batches report.
    for batch in done.values():
        content = server.http("GET", f"/files/{batch['output_file_id']}/content", api_key=secret).content
        ids = [json.loads(line)["custom_id"] for line in content.splitlines()]
        assert len(ids) == len(set(ids)) == batch["request_counts"]["total"]
    assert _key_show(server, key_id)["spent_nano_usd"] == sum(b["usage"]["cost_nano_usd"] for b in done.values())


def test_cancel_lets_a_record_in_its_retries_finish(make_server, engine):
    server = make_server(concurrency=1)
    batch = create(server, [chat("first", "retried #hold=r #fail_times=2")] + [chat(f"n{i}", f"not started {i}")
                                                                                for i in range(3)])
    engine.wait_held("r")
    engine.release("r", count=1)  # the first attempt fails; the second is held while the batch is cancelled
    wait_for(lambda: engine.gates()["r"] == {"waiting": 1, "passed": 1, "open": False}, "the second attempt")
    assert server.http("POST", f"/batches/{batch['id']}/cancel").json()["status"] == "cancelling"
    wait_for(lambda: get(server, batch["id"])["status"] == "cancelling", "the cancel")
    engine.release("r")
    done = server.wait(batch["id"])
    assert done["status"] == "cancelled"
    out, err = results(server, done)
    assert sorted(out) == ["first"]  # it was running: it finished through its retries
    assert sorted(err) == ["n0", "n1", "n2"] and {e["error"]["code"] for e in err.values()} == {"batch_cancelled"}
    assert sum("retried" in prompt_text(r) for r in engine.requests()) == 3


def test_a_failed_result_write_is_retried_and_loses_no_record(make_server, engine):
    server = make_server(concurrency=2)
    batch = create(server, [chat(f"w{i}", f"write me {i} #hold=w") for i in range(12)])
    engine.wait_held("w", 2)  # the batch runs, and no record has finished yet
    # A file where the chunk directory should be: every chunk write fails until it is removed.
    blocker = server.data_dir / "blobs" / "batches" / batch["id"] / "chunks"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("in the way")
    engine.release("w", count=2)  # two finish; the others stay held, so the run goes on while writes fail
    wait_for(lambda: "writing results failed" in server.log(), "a failed chunk write")
    blocker.unlink()
    engine.release("w")
    done = server.wait(batch["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    out, err = results(server, done)
    assert sorted(out) == sorted(f"w{i}" for i in range(12)) and err == {}
    assert done["usage"] == usage_of(out)
