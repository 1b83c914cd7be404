"""A record's body reaches the engine meaning exactly what it meant: integers of any size with every digit, floats
with their value, strings with their characters, keys in their order. The one change here is the model renamed to
the catalog's ``served_model`` (``tool_config`` stripping: tests/test_tool_calling.py)."""

from __future__ import annotations

import pytest

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

# Written by hand, so the test says exactly which bytes the user sent (orjson would not even write the integers).
BODY = ('{"model":"test/echo","messages":[{"role":"user","content":"d\\u00e9j\\u00e0 \\ud83d\\ude00 \\"q\\""}],'
        '"seed":123456789012345678901234567890,"logit_bias":{"-98765432109876543210":-100},'
        '"temperature":0.1,"top_p":1.0,"z_last":-0.0,"a_after_z":1e-7}')
RECORD = '{"custom_id":"n1","method":"POST","url":"/v1/chat/completions","body":' + BODY + '}'
SENT = ('{"model":"echo-served","messages":[{"role":"user","content":"déjà 😀 \\"q\\""}],'
        '"seed":123456789012345678901234567890,"logit_bias":{"-98765432109876543210":-100},'
        '"temperature":0.1,"top_p":1.0,"z_last":-0.0,"a_after_z":1e-7}')


@pytest.mark.parametrize("how", ["file", "inline"])
def test_body_values_reach_the_engine_exactly(server, engine, how):
    if how == "file":
        up = server.http("POST", "/files", files={"file": ("in.jsonl", (RECORD + "\n").encode())},
                         data={"purpose": "batch"})
        assert up.status_code == 200, up.text
        create = '{"endpoint":"/v1/chat/completions","completion_window":"24h","input_file_id":"' + \
            up.json()["id"] + '"}'
    else:
        create = '{"endpoint":"/v1/chat/completions","completion_window":"24h","requests":[' + RECORD + ']}'
    created = server.http("POST", "/batches", content=create.encode(), headers={"content-type": "application/json"})
    assert created.status_code == 200, created.text
    assert server.wait(created.json()["id"])["request_counts"]["completed"] == 1
    (request,) = engine.requests()
    assert request["raw"] == SENT


LONG_SYSTEM = "Answer in one line, exactly as the figures are written. " * 8  # records share it: a dispatch order


def test_body_values_reach_the_engine_exactly_through_the_dispatch_order(server, engine):
    """The same, for records the create gave a dispatch order (the worker reads each one back by its range)."""
    grouped = BODY.replace('"messages":[', '"messages":[{"role":"system","content":"' + LONG_SYSTEM + '"},', 1)
    lines = [RECORD.replace('"n1"', f'"n{i}"').replace(BODY, grouped) for i in range(3)]
    up = server.http("POST", "/files", files={"file": ("in.jsonl", "\n".join(lines).encode())},
                     data={"purpose": "batch"})
    assert up.status_code == 200, up.text
    created = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                    "input_file_id": up.json()["id"]})
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    assert (server.data_dir / "blobs" / "batches" / batch_id / "dispatch.bin").exists()
    assert server.wait(batch_id)["request_counts"]["completed"] == 3
    sent = SENT.replace('"messages":[', '"messages":[{"role":"system","content":"' + LONG_SYSTEM + '"},', 1)
    assert [request["raw"] for request in engine.requests()] == [sent] * 3
