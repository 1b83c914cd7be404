"""The engine interface: send one request body to a model server, get its HTTP-like answer back (``EngineReply``,
any status); ``EngineUnavailable`` only when no answer came. What to retry is the worker's business."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import OpenRelayError

__all__ = ["Engine", "EngineReply", "EngineTimedOut", "EngineUnavailable"]


@dataclass(frozen=True, slots=True)
class EngineReply:
    status_code: int
    body: dict[str, Any]


class EngineUnavailable(OpenRelayError):
    status = 503
    code = "engine_unavailable"


class EngineTimedOut(EngineUnavailable):
    """No answer within the engine's timeout: the engine too slow, which the adaptive limiter backs off from."""


class Engine(Protocol):
    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        """``endpoint`` is the batch endpoint (e.g. ``/v1/chat/completions``); ``body`` already names the
        engine's own model."""
        ...

    async def healthy(self) -> bool:
        """Does the engine answer at all? Asked only when calls keep failing, to tell an outage from a bad
        record; an in-process engine is healthy while its process lives."""
        ...

    async def aclose(self) -> None: ...

