"""The issue's promise: the official openai SDK works unchanged, upload to results."""

from __future__ import annotations

import orjson

from tests.support import http_client
from tests.support.polling import until_terminal


def _record(custom_id: str, text: str, model: str = "test/echo") -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": model, "messages": [{"role": "user", "content": text}]}})


def test_sdk_upload_create_poll_download(server, engine, tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(b"\n".join(_record(f"req-{i}", f"hello number {i}") for i in range(1, 6)) + b"\n")
    client = server.client()
    f = client.files.create(file=open(path, "rb"), purpose="batch")
    assert f.purpose == "batch" and f.bytes == path.stat().st_size
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert b.status == "validating" and b.request_counts.total == 5
    b = until_terminal(lambda: client.batches.retrieve(b.id), f"batch {b.id}", timeout=60)
    assert b.status == "completed"
    assert b.output_file_id == f"file-{b.id}-output" and b.error_file_id is None
    assert b.request_counts.completed == 5 and b.request_counts.failed == 0
    lines = [orjson.loads(x) for x in client.files.content(b.output_file_id).content.splitlines()]
    by_id = {line["custom_id"]: line for line in lines}
    assert sorted(by_id) == [f"req-{i}" for i in range(1, 6)]
    first = by_id["req-1"]
    assert first["id"] == "batch_req_req-1" and first["error"] is None
    assert first["response"]["status_code"] == 200
    body = first["response"]["body"]
    assert body["model"] == "test/echo"  # the catalog name, not the engine's served name
    assert body["choices"][0]["message"]["content"] == "echo: hello number 1"
    assert set(first) == {"id", "custom_id", "response", "error"}
    # The engine was asked for its own model name.
    assert {r["body"]["model"] for r in engine.requests()} == {"echo-served"}


def test_metrics_count_settled_records(server, engine, tmp_path):
    lines = [_record("ok-1", "fine"), _record("ok-2", "fine too"), _record("bad", "#status=400")]
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    client = server.client()
    f = client.files.create(file=open(path, "rb"), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert server.wait(b.id)["status"] == "completed"
    text = http_client.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert 'openrelay_records_total{model="test/echo",outcome="completed"} 2.0' in text
    assert 'openrelay_records_total{model="test/echo",outcome="failed"} 1.0' in text
