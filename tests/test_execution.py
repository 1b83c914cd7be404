"""Running batches end to end over HTTP: result lines, retries, endpoints, counts, usage and cost.

Scheduling (slots, priority, concurrency), expiry and crash recovery are in test_execution_scheduling.py.
"""

from __future__ import annotations

from tests.support.batches import chat, cost, create, create_from_file, get, prompt_text, results, usage_of, wait_for
from tests.support.server import catalog_text

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

LINE_KEYS = {"id", "custom_id", "response", "error"}


def _seen(engine, marker: str) -> int:
    """How many requests the engine received whose text carries ``marker``."""
    return sum(marker in prompt_text(r) for r in engine.requests())


def test_result_lines_success_4xx_and_5xx(make_server, engine):
    server = make_server(env={"OPENRELAY_RETRY_ATTEMPTS": "3"})
    records = [
        chat("ok-1", "first plain question"),
        chat("ok-2", "second plain question"),
        chat("bad", "refuse me #status=400"),
        chat("flaky", "flaky until third try #fail_times=2"),
        chat("broken", "always broken #status=500"),
    ]
    created = create(server, records)
    assert created["in_progress_at"] is None and created["request_counts"]["total"] == 5
    batch = server.wait(created["id"])
    assert batch["status"] == "completed"
    assert batch["output_file_id"] == f"file-{batch['id']}-output"
    assert batch["error_file_id"] == f"file-{batch['id']}-error"
    assert batch["request_counts"] == {"total": 5, "completed": 3, "failed": 2}
    out, err = results(server, batch)
    assert sorted(out) == ["flaky", "ok-1", "ok-2"] and sorted(err) == ["bad", "broken"]
    assert batch["usage"] == usage_of(out)  # the flaky record's three attempts are billed as one answer

    for custom_id, line in out.items():
        assert set(line) == LINE_KEYS
        assert line["id"] == f"batch_req_{custom_id}" and line["custom_id"] == custom_id
        assert line["error"] is None
        assert set(line["response"]) == {"status_code", "request_id", "body"} and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["model"] == "test/echo"  # the catalog name, not the engine's
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert set(body["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert out["ok-1"]["response"]["body"]["choices"][0]["message"]["content"] == "echo: first plain question"
    assert out["flaky"]["response"]["body"]["choices"][0]["message"]["content"].startswith("echo: flaky")

    bad = err["bad"]
    assert set(bad) == LINE_KEYS and bad["id"] == "batch_req_bad" and bad["response"] is None
    assert set(bad["error"]) == {"code", "message", "status_code", "request_id"}
    assert bad["error"]["code"] == "invalid_request_error" and bad["error"]["status_code"] == 400
    assert isinstance(bad["error"]["message"], str) and bad["error"]["message"]
    broken = err["broken"]
    assert broken["id"] == "batch_req_broken" and broken["response"] is None
    assert broken["error"]["status_code"] == 500 and isinstance(broken["error"]["code"], str)

    # What the engine saw: its own model name, a 4xx once, a flaky record until it worked, a 5xx to the limit.
    requests = engine.requests()
    assert requests and {r["body"]["model"] for r in requests} == {"echo-served"}
    assert {r["path"] for r in requests} == {"/v1/chat/completions"}
    assert _seen(engine, "refuse me") == 1
    assert _seen(engine, "flaky until") == 3
    # Its attempts ran out, then the gate asked whether the engine itself was sick. When the flaky record's
    # success came first, the engine was answering others: 3 calls. When "broken" and "flaky" were both failing
    # and no call sent since had succeeded, it paused once (the safe side, docs/guarantees.md) and tried again: 6.
    assert _seen(engine, "always broken") in (3, 6)
    assert _seen(engine, "first plain") == 1 and _seen(engine, "second plain") == 1


def test_no_error_file_when_nothing_failed(server, engine):
    batch = server.wait(create(server, [chat(f"r{i}", f"question {i}") for i in range(4)])["id"])
    assert batch["status"] == "completed"
    assert batch["output_file_id"] == f"file-{batch['id']}-output" and batch["error_file_id"] is None
    out, err = results(server, batch)
    assert sorted(out) == ["r0", "r1", "r2", "r3"] and err == {}


def test_429_retried_until_it_clears_and_429_forever_is_an_error_line(make_server, engine):
    # Retries without end at a short backoff, so the engine can be switched back while records wait.
    server = make_server(env={"OPENRELAY_RETRY_ATTEMPTS": "100000", "OPENRELAY_RETRY_MAX_SECONDS": "0.1"})
    engine.mode(status=429)
    batch_id = create(server, [chat(f"t{i}", f"throttled {i}") for i in range(3)])["id"]
    wait_for(lambda: engine.stats()["requests"] >= 9, "records to be retried on 429")
    assert get(server, batch_id)["status"] == "in_progress"
    engine.mode(status=None)
    batch = server.wait(batch_id)
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    out, err = results(server, batch)
    assert sorted(out) == ["t0", "t1", "t2"] and err == {}

    engine.reset()
    limited = make_server(env={"OPENRELAY_RETRY_ATTEMPTS": "3"})
    batch = limited.wait(create(limited, [chat("slow-down", "always throttled #status=429")])["id"])
    out, err = results(limited, batch)
    assert out == {} and err["slow-down"]["error"]["status_code"] == 429
    assert _seen(engine, "always throttled") == 3


def test_engine_timeout_is_retried_then_the_records_error_line(make_server, engine, engine_url):
    catalog = catalog_text(engine_url, concurrency=4, timeout_seconds=0.5)
    server = make_server(catalog=catalog, env={"OPENRELAY_RETRY_ATTEMPTS": "2", "OPENRELAY_RETRY_MAX_SECONDS": "0.1"})
    batch = server.wait(create(server, [chat("slow", "too slow to wait for #hold=never"),
                                        chat("quick", "quick answer")])["id"])
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    out, err = results(server, batch)
    assert sorted(out) == ["quick"]
    assert err["slow"]["error"] == {"code": "engine_unavailable", "message": "engine timed out", "status_code": 503,
                                    "request_id": err["slow"]["error"]["request_id"]}
    assert _seen(engine, "too slow") == 2  # timed out, retried once, timed out again


def test_completions_and_embeddings_batches(server, engine):
    completions = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "test/echo", "prompt": f"complete this text number {i}"}} for i in range(3)]
    embeddings = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                   "body": {"model": "test/echo", "input": f"embed {i} please"}} for i in range(3)]
    done_c = server.wait(create(server, completions, endpoint="/v1/completions")["id"])
    done_e = server.wait(create_from_file(server, embeddings, endpoint="/v1/embeddings")["id"])

    for batch, prefix in ((done_c, "c"), (done_e, "e")):
        assert batch["status"] == "completed" and batch["error_file_id"] is None
        assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        out, _ = results(server, batch)
        assert sorted(out) == [f"{prefix}{i}" for i in range(3)]
        for custom_id, line in out.items():
            assert set(line) == LINE_KEYS and line["id"] == f"batch_req_{custom_id}"
            assert line["response"]["status_code"] == 200 and line["response"]["body"]["model"] == "test/echo"
        assert {k: batch["usage"][k] for k in usage_of(out)} == usage_of(out)

    out_c, _ = results(server, done_c)
    body = out_c["c1"]["response"]["body"]
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "echo: complete this text number 1"
    assert done_c["usage"]["output_tokens"] > 0

    out_e, _ = results(server, done_e)
    body = out_e["e2"]["response"]["body"]
    assert body["object"] == "list" and len(body["data"][0]["embedding"]) == 8
    assert body["usage"]["prompt_tokens"] == 3
    assert done_e["usage"]["input_tokens"] == 9 and done_e["usage"]["output_tokens"] == 0
    assert done_e["usage"]["cost_nano_usd"] == cost(9, 0) == 1350

    paths = [r["path"] for r in engine.requests()]
    assert paths.count("/v1/completions") == 3 and paths.count("/v1/embeddings") == 3
    assert {r["body"]["model"] for r in engine.requests()} == {"echo-served"}


def test_counts_usage_and_cost_standard_and_expedited(server, engine):
    records = [chat(f"u{i}", f"{'word ' * (i + 1)}#tokens={7 * i + 1}") for i in range(6)]
    records.append(chat("u-bad", "this one fails #status=400"))
    standard = server.wait(create(server, records)["id"])
    client = server.client()
    sdk = client.batches.create(input_file_id=standard["input_file_id"], endpoint="/v1/chat/completions",
                                completion_window="24h", extra_body={"priority": "expedited"})
    assert sdk.priority == "expedited"
    expedited = server.wait(sdk.id)
    assert expedited["priority"] == "expedited" and standard["priority"] == "standard"

    by_tier = {}
    for batch in (standard, expedited):
        assert batch["status"] == "completed"
        counts = batch["request_counts"]
        assert counts == {"total": 7, "completed": 6, "failed": 1}
        assert counts["completed"] + counts["failed"] == counts["total"]
        out, err = results(server, batch)
        assert len(out) == 6 and list(err) == ["u-bad"]
        for i in range(6):
            usage = out[f"u{i}"]["response"]["body"]["usage"]
            assert usage["completion_tokens"] == 7 * i + 1
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        expected = usage_of(out, batch["priority"])
        assert batch["usage"] == expected
        by_tier[batch["priority"]] = batch["usage"]

    # Same records, same tokens; only the tier factor differs (0.75 vs 0.5).
    std, exp = by_tier["standard"], by_tier["expedited"]
    assert std["input_tokens"] == exp["input_tokens"] and std["output_tokens"] == exp["output_tokens"]
    assert std["cost_nano_usd"] == cost(std["input_tokens"], std["output_tokens"], "standard")
    assert exp["cost_nano_usd"] == cost(exp["input_tokens"], exp["output_tokens"], "expedited")
    assert exp["cost_nano_usd"] * 2 == std["cost_nano_usd"] * 3
    assert std["output_tokens"] == sum(7 * i + 1 for i in range(6))


def test_counts_and_usage_grow_while_running(make_server, engine):
    server = make_server(concurrency=2)
    total = 20
    batch_id = create(server, [chat(f"p{i}", f"slow progress {i} #hold=p") for i in range(total)])["id"]
    engine.wait_held("p", 2)
    engine.release("p", count=2)  # two finish; the rest wait until the partial view is seen
    seen: list[dict] = []

    def partial():
        batch = get(server, batch_id)
        seen.append(batch)
        counts = batch["request_counts"]
        return batch if batch["status"] == "in_progress" and 0 < counts["completed"] < total else None

    during = wait_for(partial, "a batch part way through")
    assert during["in_progress_at"] is not None
    assert during["usage"]["input_tokens"] > 0 and during["usage"]["cost_nano_usd"] > 0
    assert during["usage"]["total_tokens"] == during["usage"]["input_tokens"] + during["usage"]["output_tokens"]
    engine.release("p")
    done = server.wait(batch_id)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == total
    assert done["usage"]["input_tokens"] > during["usage"]["input_tokens"]
    assert done["usage"]["cost_nano_usd"] > during["usage"]["cost_nano_usd"]
    out, _ = results(server, done)
    assert done["usage"] == usage_of(out)
    # Progress only ever goes up.
    completed = [b["request_counts"]["completed"] for b in seen]
    assert completed == sorted(completed)
