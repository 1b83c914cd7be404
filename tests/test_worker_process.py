"""`orl worker` in its own process shares the store with `orl serve`: batches are claimed by exactly one of them."""

from __future__ import annotations

from collections import Counter

import orjson


def _batch_file(tmp_path, name: str, count: int):
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(b"".join(orjson.dumps({
        "custom_id": f"{name}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "test/echo", "messages": [{"role": "user", "content": f"{name} {i} #sleep=0.1"}]},
    }) + b"\n" for i in range(count)))
    return path


def test_serve_and_a_separate_worker_run_each_record_once(make_server, engine, tmp_path, start_worker):
    server = make_server(slots=4, concurrency=4)
    worker = start_worker(server)  # both claim loops are running before the batches arrive
    client = server.client()
    ids = []
    for name in ("a", "b", "c", "d", "e", "f"):
        upload = client.files.create(file=open(_batch_file(tmp_path, name, 15), "rb"), purpose="batch")
        ids.append(client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                         completion_window="24h").id)
    for batch_id in ids:
        done = server.wait(batch_id)
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 15, "completed": 15, "failed": 0}
        lines = client.files.content(done["output_file_id"]).content.splitlines()
        assert len(lines) == 15
    sent = Counter(r["body"]["messages"][0]["content"] for r in engine.requests())
    assert len(sent) == 90 and set(sent.values()) == {1}  # no record ran twice across the two processes
    assert worker.alive(), "the worker process died"
