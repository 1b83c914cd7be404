"""An engine that turns sick mid-batch (500 to every call while its /v1/models still answers) is waited for: no
record in flight at the onset is given up while the engine is judged sick."""

from __future__ import annotations

import re

from tests.support import http_client
from tests.support.batches import chat, create, get, results, usage_of, wait_for

FAST = {"OPENRELAY_RETRY_ATTEMPTS": "3", "OPENRELAY_OUTAGE_BASE_SECONDS": "0.2", "OPENRELAY_OUTAGE_MAX_SECONDS": "0.5"}


def _engine_up(server) -> float | None:
    text = http_client.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    found = re.search(r'^openrelay_engine_up\{model="test/echo",replica="[^"]*"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_records_in_flight_when_the_engine_turns_sick_wait_for_it_and_all_complete(make_server, engine):
    concurrency, total = 64, 600
    server = make_server(slots=1, concurrency=concurrency, env=FAST)
    batch_id = create(server, [chat(f"s{i}", f"through the sickness {i} #hold=onset") for i in range(total)])["id"]
    engine.wait_held("onset", concurrency)  # a full set of calls in flight
    engine.mode(status=500)  # from now on every call fails; /v1/models still answers 200
    # The calls sent before the onset now succeed, after the first calls sent since have failed: exactly the
    # race that made records look "at fault" while the engine was sick.
    engine.release("onset")
    wait_for(lambda: server.log().count("it fails every call") >= 3, "three sick pauses", timeout=120)
    during = get(server, batch_id)
    assert during["status"] == "in_progress" and during["request_counts"]["failed"] == 0, during
    # While sick the replica leaves rotation between probes: the gauge shows it out (its probe passes, so it comes
    # back to be tried again, and the gauge with it).
    wait_for(lambda: _engine_up(server) == 0.0, "openrelay_engine_up to show the sick engine out of rotation")
    engine.mode(status=None)
    batch = server.wait(batch_id, timeout=180)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": total, "completed": total, "failed": 0}
    out, err = results(server, batch)
    assert len(out) == total and err == {}
    assert batch["usage"] == usage_of(out)
    assert _engine_up(server) == 1.0
