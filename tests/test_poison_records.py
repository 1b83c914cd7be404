"""What one bad record, input or catalog entry can do to a model: end its own record, or its own batch, and nothing
else. Real `orl serve` processes and the test engine (held by the test where timing matters), or the built-in
llama.cpp model."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.batches import chat, create, create_from_file, get, results, wait_for
from tests.support.forked import run_orl
from tests.support.server import TEST_CATALOG, free_port

FAST_RUN_RETRIES = {"OPENRELAY_RUN_ATTEMPTS": "3", "OPENRELAY_RUN_RETRY_BASE_SECONDS": "3",
                    "OPENRELAY_RUN_RETRY_MAX_SECONDS": "3"}


def test_a_batch_whose_runs_keep_failing_ends_failed_and_frees_its_slot_while_it_waits(make_server, engine):
    server = make_server(slots=1, env=FAST_RUN_RETRIES)
    holder = create(server, [chat("h", "#hold=slot")])
    engine.wait_held("slot", 1)
    broken = create_from_file(server, [chat("a1", "one"), chat("a2", "two")])
    # The input's bytes vanish from the blob store: every run of this batch fails before its first record.
    blob = server.data_dir / "blobs" / "files" / broken["input_file_id"]
    assert blob.is_file()
    blob.unlink()
    behind = create(server, [chat("b1", "three")])
    engine.release("slot")

    after = server.wait(behind["id"], timeout=60)
    assert after["status"] == "completed"
    # The broken batch was older and came first, yet the batch behind it ran while it waited out its backoff.
    assert get(server, broken["id"])["status"] == "in_progress"
    assert server.wait(holder["id"])["status"] == "completed"

    failed = server.wait(broken["id"], timeout=60)
    assert failed["status"] == "failed"
    assert failed["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    (error,) = failed["errors"]["data"]
    assert error["code"] == "batch_run_failed"
    assert "3 attempts" in error["message"] and "missing" in error["message"]
    assert failed["usage"]["cost_nano_usd"] == 0
    assert server.log().count(f"batch {broken['id']}: run ") == 3  # three runs, then the end: no loop


def test_a_cancel_ends_a_batch_whose_runs_keep_failing(make_server, engine):
    server = make_server(slots=1, env={**FAST_RUN_RETRIES, "OPENRELAY_RUN_RETRY_BASE_SECONDS": "1",
                                       "OPENRELAY_RUN_RETRY_MAX_SECONDS": "1"})
    broken = create_from_file(server, [chat("a1", "one")])
    (server.data_dir / "blobs" / "files" / broken["input_file_id"]).unlink()
    wait_for(lambda: f"batch {broken['id']}: run 1 of 3 failed" in server.log(), "the first failed run")
    assert server.http("POST", f"/batches/{broken['id']}/cancel").status_code == 200
    cancelled = server.wait(broken["id"], timeout=60)
    assert cancelled["status"] == "cancelled"
    assert cancelled["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    assert cancelled["errors"]["data"][0]["code"] == "batch_run_failed"


def test_the_last_record_finishing_after_the_window_passed_completes_the_batch(make_server, engine):
    server = make_server(args=("--window-seconds", "2"))
    batch = create(server, [chat("late", "#hold=late")])
    engine.wait_held("late", 1)
    wait_for(lambda: time.time() > batch["expires_at"] + 1, "the window to pass", timeout=30, every=0.2)
    engine.release("late")
    done = server.wait(batch["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    out, err = results(server, done)
    assert set(out) == {"late"} and not err


def _bad_catalog(tmp_path: Path, engine_line: str) -> subprocess.CompletedProcess[str]:
    text = TEST_CATALOG.format(engine="http://127.0.0.1:9/v1", slots=1, concurrency=1)
    text = text.replace('engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }', engine_line)
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return run_orl(["serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--catalog", str(path)],
                   env=dict(os.environ), timeout=60)


@pytest.mark.parametrize(("engine_line", "message"), [
    ('engine = { kind = "openai" }', "'test/embed' (engine openai) needs base_url"),
    ('engine = { kind = "openai", base_url = "127.0.0.1:9/v1" }', "needs base_url, an http(s) URL"),
    ('engine = { kind = "vllm", base_url = "http://127.0.0.1:9/v1" }', "unknown engine kind 'vllm'"),
    ('engine = { kind = "llama-cpp", gguf = "/nowhere/model.gguf" }', "model file '/nowhere/model.gguf' does not "
                                                                      "exist"),
    ('engine = { kind = "llama-cpp", gguf = "no_such_package:m.gguf" }', "'no_such_package' carrying"),
    ('engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1", timeout_seconds = "soon" }',
     "timeout_seconds must be a positive number"),
    ('engine = { kind = "openai", base_urls = [] }', "needs base_urls to be a non-empty list"),
    ('engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1", base_urls = ["http://127.0.0.1:9/v1"] }',
     "takes base_url or base_urls, not both"),
    ('engine = { kind = "openai", base_urls = ["http://127.0.0.1:9/v1", "ftp://x/v1"] }',
     "needs base_urls entry (got 'ftp://x/v1')"),
    ('engine = { kind = "openai", base_urls = ["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/"] }',
     "lists one base_urls entry twice"),
])
def test_a_bad_catalog_stops_the_process_at_start_with_a_clear_message(tmp_path, engine_line, message):
    done = _bad_catalog(tmp_path, engine_line)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created


@pytest.mark.parametrize(("concurrency", "message"), [
    ('"lots"', 'needs concurrency to be an integer >= 1 or "auto"'),
    ('"auto"\nmin_concurrency = 0', "needs 1 <= min_concurrency <= max_concurrency"),
    ('"auto"\nmin_concurrency = 8\nmax_concurrency = 4', "needs 1 <= min_concurrency <= max_concurrency"),
    ('4\nprefix_grouping = "yes"', "needs prefix_grouping to be true or false"),
])
def test_bad_scheduling_knobs_are_a_start_up_error(tmp_path, concurrency, message):
    path = tmp_path / "catalog.toml"
    path.write_text(TEST_CATALOG.format(engine="http://127.0.0.1:9/v1", slots=1, concurrency=concurrency))
    done = run_orl(["worker", "--data-dir", str(tmp_path / "data"), "--catalog", str(path)], env=dict(os.environ),
                   timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_catalog_field_of_the_wrong_type_is_a_start_up_error(tmp_path):
    text = TEST_CATALOG.format(engine="http://127.0.0.1:9/v1", slots='"two"', concurrency=1)
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    done = run_orl(["worker", "--data-dir", str(tmp_path / "data"), "--catalog", str(path)], env=dict(os.environ),
                   timeout=60)
    assert done.returncode == 2 and "wrong type" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_malformed_chat_record_on_the_builtin_model_is_its_own_400_line(make_server):
    server = make_server(catalog="builtin")
    model = "openrelay/smollm2-135m"
    records = [
        {"custom_id": "good", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}},
        {"custom_id": "typo", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": [{"rolez": "user", "contentz": "Say hi."}]}},
        {"custom_id": "bad-max", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "max_tokens": "many", "messages": [{"role": "user", "content": "Say hi."}]}},
        {"custom_id": "hot", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "temperature": "hot", "messages": [{"role": "user", "content": "Say hi."}]}},
    ]
    first = server.wait(create(server, records)["id"], timeout=240)
    assert first["status"] == "completed"
    assert first["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    out, err = results(server, first)
    assert out["good"]["response"]["body"]["model"] == model
    for custom_id in ("typo", "bad-max", "hot"):
        assert err[custom_id]["error"]["code"] == "invalid_request_error"
        assert err[custom_id]["error"]["status_code"] == 400
    assert "role" in err["typo"]["error"]["message"]
    # The field named, not an exception's text ("TypeError: '<' not supported between instances of 'str' ...").
    assert err["hot"]["error"]["message"] == "temperature: must be a number (got 'hot')"
    # The model's only slot is free again: the next batch runs.
    second = server.wait(create(server, records[:1])["id"], timeout=240)
    assert second["status"] == "completed" and second["request_counts"]["completed"] == 1
