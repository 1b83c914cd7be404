"""How one call to an engine went, classified once (``outcome_of``, in ``Replica.send``): the one vocabulary in
which the gate (``gate.py``) decides what to send again and the adaptive limiter (``limiter.py``) learns."""

from __future__ import annotations

from enum import StrEnum

from ..engines.base import EngineReply, EngineTimedOut, EngineUnavailable

__all__ = ["Outcome", "outcome_of"]


class Outcome(StrEnum):
    SUCCESS = "success"  # a 2xx: the record's answer, and a latency sample for the limiter
    REFUSED = "refused"  # any other answer below 500 but 408 and 429 (a 400, a 404): the record's answer, sent once
    OVERLOAD = "overload"  # 429 or 503: the engine has too much to do: the limiter backs off, the record goes again
    TIMEOUT = "timeout"  # 408, 504 or no answer within the timeout: the limiter backs off, the record goes again
    FAILED = "failed"  # any other 5xx: the record goes again, the replica is probed
    NO_ANSWER = "no_answer"  # a refused or reset connection: as FAILED
    IGNORE = "ignore"  # the call was cancelled before its answer: tells nothing

    @property
    def final(self) -> bool:
        """The record's answer: it is not sent again."""
        return self in (Outcome.SUCCESS, Outcome.REFUSED)

    @property
    def backs_off(self) -> bool:
        """The engine too busy or too slow (latency at its extreme): the adaptive limiter sends fewer calls."""
        return self in (Outcome.OVERLOAD, Outcome.TIMEOUT)


def outcome_of(answer: EngineReply | EngineUnavailable) -> Outcome:
    if isinstance(answer, EngineUnavailable):
        return Outcome.TIMEOUT if isinstance(answer, EngineTimedOut) else Outcome.NO_ANSWER
    status = answer.status_code
    if 200 <= status < 300:
        return Outcome.SUCCESS
    if status in (429, 503):
        return Outcome.OVERLOAD
    if status in (408, 504):
        return Outcome.TIMEOUT
    return Outcome.FAILED if status >= 500 else Outcome.REFUSED
