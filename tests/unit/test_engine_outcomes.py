"""How one call to an engine went (openrelay/worker/outcome.py), classified once for the gate and the limiter: each
answer's outcome, what the limiter learns from it through a replica, and the timeout a real HTTP engine raises."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from openrelay.config import Settings
from openrelay.engines.base import EngineReply, EngineTimedOut, EngineUnavailable
from openrelay.engines.openai_http import OpenAIEngine
from openrelay.worker.limiter import ConcurrencyLimiter
from openrelay.worker.outcome import Outcome, outcome_of
from openrelay.worker.replicas import Replica
from tests.support.mock_engine import EngineRequest, MockEngine, no_answer, reply

STATUSES = {Outcome.SUCCESS: (200, 201), Outcome.REFUSED: (302, 400, 404, 413), Outcome.TIMEOUT: (408, 504),
            Outcome.OVERLOAD: (429, 503), Outcome.FAILED: (500, 502)}
ANSWERS: list[tuple[int | EngineUnavailable, Outcome]] = [(s, o) for o, ss in STATUSES.items() for s in ss] + [
    (EngineTimedOut("engine timed out"), Outcome.TIMEOUT),
    (EngineUnavailable("connection refused"), Outcome.NO_ANSWER),
    # the type tells a timeout, never the words of a message
    (EngineUnavailable("the model could not be loaded: its download timed out"), Outcome.NO_ANSWER),
]


@pytest.mark.parametrize(("answer", "expected"), ANSWERS, ids=str)
def test_each_answer_has_one_outcome(answer: int | EngineUnavailable, expected: Outcome) -> None:
    assert outcome_of(EngineReply(answer, {}) if isinstance(answer, int) else answer) is expected


def test_the_gate_ends_a_record_on_an_answer_below_500_and_the_limiter_backs_off_from_overload_and_timeouts() -> None:
    assert {o for o in Outcome if o.final} == {Outcome.SUCCESS, Outcome.REFUSED}
    assert {o for o in Outcome if o.backs_off} == {Outcome.OVERLOAD, Outcome.TIMEOUT}


@pytest.mark.parametrize(("answer", "expected"), ANSWERS, ids=str)
def test_a_replica_reports_the_outcome_to_its_limiter(answer: int | EngineUnavailable, expected: Outcome) -> None:
    """The gate gets the outcome the limiter learns from: one that backs off shrinks the limit, no other does."""
    def handler(request: EngineRequest) -> EngineReply:
        if isinstance(answer, EngineUnavailable):
            raise answer
        return reply(answer)

    limiter = ConcurrencyLimiter(1, 64, initial=10, baseline=1.0)
    settings = Settings.build(data_dir=Path("data"), database_url="sqlite://", environ={})
    replica = Replica("m", "http://replica.test/v1", MockEngine(handler), settings, limiter=limiter, capacity=10)
    got, outcome = asyncio.run(replica.send("/v1/chat/completions", {}))
    assert outcome is expected
    assert got.status_code == (answer if isinstance(answer, int) else 503)
    assert limiter.limit == (8 if expected.backs_off else 10) and limiter.in_flight == 0


def test_a_replica_whose_call_is_cancelled_frees_its_slot_and_teaches_nothing() -> None:
    async def never(request: EngineRequest) -> EngineReply:
        await asyncio.Event().wait()
        no_answer()

    async def cancelled() -> None:
        call = asyncio.ensure_future(replica.send("/v1/chat/completions", {}))
        while not engine.requests:
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    limiter = ConcurrencyLimiter(1, 64, initial=10, baseline=1.0)
    engine = MockEngine(never)
    settings = Settings.build(data_dir=Path("data"), database_url="sqlite://", environ={})
    replica = Replica("m", "http://replica.test/v1", engine, settings, limiter=limiter, capacity=10)
    asyncio.run(cancelled())
    assert limiter.limit == 10 and limiter.in_flight == 0 and replica.in_flight == 0


def test_an_http_engine_that_does_not_answer_in_time_raises_engine_timed_out() -> None:
    """A real server that takes the request and never answers: ``EngineTimedOut``; a port nobody listens on: no
    answer, but no timeout."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    async def calls() -> tuple[BaseException, BaseException]:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        waiting = OpenAIEngine({"base_url": f"http://127.0.0.1:{port}/v1", "timeout_seconds": 0.2}, max_connections=1)
        refused = OpenAIEngine({"base_url": f"http://127.0.0.1:{_closed_port()}/v1"}, max_connections=1)
        try:
            errors = []
            for engine in (waiting, refused):
                with pytest.raises(EngineUnavailable) as raised:
                    await engine.call("/v1/chat/completions", {"model": "m"})
                errors.append(raised.value)
            return errors[0], errors[1]
        finally:
            await waiting.aclose()
            await refused.aclose()
            server.close()

    timed_out, unreachable = asyncio.run(calls())
    assert isinstance(timed_out, EngineTimedOut) and outcome_of(timed_out) is Outcome.TIMEOUT
    assert not isinstance(unreachable, EngineTimedOut) and outcome_of(unreachable) is Outcome.NO_ANSWER


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
