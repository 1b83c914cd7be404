"""The engine gate as a run meets it (docs/design.md, "The engine gate"): what is sent again and what is a record's
final answer, replicas that leave rotation and come back, an engine that is down or sick, and adaptive
concurrency's 429s. Real runs on a real store, the engine replaced at its boundary (tests/support/relay.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest

from openrelay.engines.base import EngineReply, EngineTimedOut
from tests.support.batches import chat, create, get, results
from tests.support.mock_engine import EngineRequest, echo, no_answer, reply, text_of
from tests.support.relay import ENGINE_URL, Relay
from tests.support.server import catalog_text

REPLICAS = ["http://replica-a.test/v1", "http://replica-b.test/v1"]


def run(relay: Relay, records: list[dict]) -> tuple[dict, dict, dict]:
    """Create a batch of ``records``, run it to its end: (the batch, its output lines, its error lines)."""
    batch = create(relay, records)
    relay.run_until_idle()
    done = get(relay, batch["id"])
    out, err = results(relay, done)
    return done, out, err


def calls_per_record(relay: Relay, url: str = ENGINE_URL) -> Counter[str]:
    return Counter(text_of(request) for request in relay.requests(url))


def failing_first(times: int, answer: int | None) -> Callable[[EngineRequest], EngineReply]:
    """A handler that gives each record ``answer`` (a status, or None: no answer) ``times`` times, then echoes."""
    seen: Counter[str] = Counter()

    def handle(request: EngineRequest) -> EngineReply:
        text = text_of(request)
        seen[text] += 1
        if seen[text] > times:
            return echo(request)
        if answer is None:
            no_answer()
        return reply(answer)
    return handle


@pytest.mark.parametrize("answer", [500, 502, 503, 504, 408, 429, None], ids=lambda a: f"{a or 'no answer'}")
def test_a_retryable_failure_is_sent_again_and_the_record_completes(relay: Relay, answer: int | None) -> None:
    relay.handler = failing_first(2, answer)
    done, out, err = run(relay, [chat(f"r{i}", f"question {i}") for i in range(4)])
    assert done["status"] == "completed" and err == {}
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert calls_per_record(relay) == {f"question {i}": 3 for i in range(4)}


def test_a_timed_out_call_is_sent_again(relay: Relay) -> None:
    seen: list[str] = []

    def timing_out(request: EngineRequest) -> EngineReply:
        seen.append(text_of(request))
        if seen.count(text_of(request)) == 1:
            raise EngineTimedOut("engine timed out")
        return echo(request)
    relay.handler = timing_out
    done, out, err = run(relay, [chat("slow", "take your time")])
    assert done["status"] == "completed" and list(out) == ["slow"] and seen == ["take your time"] * 2


@pytest.mark.parametrize("status", [400, 401, 404, 413, 422])
def test_a_client_error_is_the_records_final_answer_sent_once(relay: Relay, status: int) -> None:
    relay.handler = lambda request: (reply(status, message="the engine refuses this")
                                     if text_of(request) == "bad" else echo(request))
    done, out, err = run(relay, [chat("good", "fine"), chat("bad", "bad")])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert sorted(out) == ["good"] and sorted(err) == ["bad"]
    error = err["bad"]["error"]
    assert error["status_code"] == status and error["message"] == "the engine refuses this"
    assert error["code"] == "invalid_request_error" and err["bad"]["response"] is None
    assert calls_per_record(relay)["bad"] == 1


def test_a_record_that_always_fails_ends_with_its_engines_error_after_its_attempts(tmp_path) -> None:
    with Relay(tmp_path, env={"OPENRELAY_RETRY_ATTEMPTS": "3"}) as relay:
        relay.handler = lambda request: reply(500, message="poison") if text_of(request) == "poison" \
            else echo(request)
        records = [chat(f"ok{i}", f"fine {i}") for i in range(6)] + [chat("poison", "poison")]
        done, out, err = run(relay, records)
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 7, "completed": 6, "failed": 1}
        assert sorted(err) == ["poison"] and err["poison"]["error"]["status_code"] == 500
        assert calls_per_record(relay)["poison"] == 3  # OPENRELAY_RETRY_ATTEMPTS


def test_an_exception_inside_the_engine_is_that_records_server_error(relay: Relay) -> None:
    def broken(request: EngineRequest) -> EngineReply:
        if text_of(request) == "boom":
            raise RuntimeError("the driver broke")
        return echo(request)
    relay.handler = broken
    done, out, err = run(relay, [chat("boom", "boom"), chat("fine", "fine")])
    assert done["status"] == "completed" and sorted(out) == ["fine"]
    assert err["boom"]["error"]["code"] == "server_error"
    assert "RuntimeError: the driver broke" in err["boom"]["error"]["message"]


def test_an_engine_that_is_down_is_waited_for_and_no_record_fails(relay: Relay) -> None:
    """No answer and a failing probe: the replica leaves rotation, the records wait, and once a probe passes
    again every record completes: an outage costs time, not records."""
    state = {"down": True, "probes": 0}

    def health() -> bool:
        state["probes"] += 1
        if state["probes"] >= 3:
            state["down"] = False
        return not state["down"]

    relay.handler = lambda request: no_answer() if state["down"] else echo(request)
    relay.engine().health = health
    done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(10)])
    assert done["status"] == "completed" and err == {} and len(out) == 10
    assert state["probes"] >= 3


def test_a_sick_engine_is_waited_for_up_to_sick_engine_seconds_then_records_fail(tmp_path) -> None:
    """The probe passes but every call fails: the records wait (the replica out of rotation as sick) for
    ``sick_engine_seconds``, then end with the engine's error."""
    with Relay(tmp_path, env={"OPENRELAY_SICK_ENGINE_SECONDS": "0.2", "OPENRELAY_RETRY_ATTEMPTS": "2"}) as relay:
        relay.handler = lambda request: reply(500, message="CUDA error")
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(3)])
        assert done["status"] == "completed" and out == {}
        assert {cid: line["error"]["status_code"] for cid, line in err.items()} == {f"r{i}": 500 for i in range(3)}
        assert all(n > 2 for n in calls_per_record(relay).values())  # more than one round of attempts each


def test_a_sick_engine_that_recovers_loses_no_record(tmp_path) -> None:
    with Relay(tmp_path, env={"OPENRELAY_RETRY_ATTEMPTS": "2"}) as relay:
        relay.handler = failing_first(5, 500)  # more failures per record than its attempts
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(3)])
        assert done["status"] == "completed" and err == {} and sorted(out) == ["r0", "r1", "r2"]


def test_with_two_replicas_a_failed_call_goes_at_once_to_the_other(tmp_path) -> None:
    catalog = catalog_text(ENGINE_URL, engine_urls=REPLICAS)
    with Relay(tmp_path, catalog=catalog) as relay:
        relay.engine(REPLICAS[0]).handler = lambda request: reply(500, message="replica a broke")
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(12)])
        assert done["status"] == "completed" and err == {} and len(out) == 12
        assert sorted(text_of(r) for r in relay.requests(REPLICAS[1])) == sorted(f"q {i}" for i in range(12))


def test_a_replica_whose_probe_fails_leaves_rotation(tmp_path) -> None:
    catalog = catalog_text(ENGINE_URL, engine_urls=REPLICAS, concurrency=4)
    with Relay(tmp_path, catalog=catalog) as relay:
        down = relay.engine(REPLICAS[0])
        down.handler = lambda request: no_answer()
        down.health = False
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(40)])
        assert done["status"] == "completed" and err == {} and len(out) == 40
        assert down.probes >= 1
        assert len(down.requests) <= 4  # at most each lane's first call: then it is out of rotation


def test_records_are_shared_between_healthy_replicas(tmp_path) -> None:
    catalog = catalog_text(ENGINE_URL, engine_urls=REPLICAS, concurrency=4)
    with Relay(tmp_path, catalog=catalog) as relay:
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(40)])
        assert done["status"] == "completed" and len(out) == 40
        assert relay.requests(REPLICAS[0]) and relay.requests(REPLICAS[1])
        assert len(relay.requests(REPLICAS[0])) + len(relay.requests(REPLICAS[1])) == 40


AUTO = catalog_text(ENGINE_URL, concurrency='"auto"\nmin_concurrency = 1\nmax_concurrency = 8')


def test_with_adaptive_concurrency_a_429_uses_up_no_attempt(tmp_path) -> None:
    with Relay(tmp_path, catalog=AUTO, env={"OPENRELAY_RETRY_ATTEMPTS": "2"}) as relay:
        relay.handler = failing_first(6, 429)  # three times the attempts a record has
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(3)])
        assert done["status"] == "completed" and err == {} and len(out) == 3
        assert calls_per_record(relay) == {f"q {i}": 7 for i in range(3)}


def test_with_fixed_concurrency_a_429_is_a_failed_attempt(tmp_path) -> None:
    with Relay(tmp_path, env={"OPENRELAY_RETRY_ATTEMPTS": "2"}) as relay:
        relay.handler = lambda request: reply(429, message="slow down") if text_of(request) == "q 0" \
            else echo(request)
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(3)])
        assert done["status"] == "completed" and sorted(out) == ["r1", "r2"]
        assert err["r0"]["error"]["status_code"] == 429 and calls_per_record(relay)["q 0"] == 2


def test_an_adaptive_run_completes_on_an_engine_that_pushes_back_past_a_load(tmp_path) -> None:
    in_flight = {"now": 0, "most": 0}

    async def limited(request: EngineRequest) -> EngineReply:
        if in_flight["now"] >= 3:
            return reply(429, message="too many requests")
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            await asyncio.sleep(0)
            return echo(request)
        finally:
            in_flight["now"] -= 1

    with Relay(tmp_path, catalog=AUTO) as relay:
        relay.handler = limited
        done, out, err = run(relay, [chat(f"r{i}", f"q {i}") for i in range(60)])
        assert done["status"] == "completed" and err == {} and len(out) == 60
        assert in_flight["most"] <= 3
