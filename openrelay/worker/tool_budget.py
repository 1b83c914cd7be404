"""A record's tool-server time (``ToolLimits``): each operation of its tool loop gets the per-call timeout or what
is left of the record's, if less; connecting, listing and closing the sessions count too."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import anyio

from ..catalog import ToolLimits
from .tool_errors import ToolLoopFailed

__all__ = ["ToolBudget"]

T = TypeVar("T")


class ToolBudget:
    """The record's tool-server time: each operation gets the per-call timeout or what is left, if less.

    A tool call is timed by a cancel scope of its own (``run``). Connecting and listing are timed by
    ``setup_scope``, which encloses the sessions' whole life: a session is entered in one step and left at the
    end of the record, and a cancel scope must enclose both. Its deadline is set only while a step runs."""

    def __init__(self, limits: ToolLimits) -> None:
        self.limits = limits
        self.left = limits.record_timeout_seconds
        self.setup_scope = anyio.CancelScope()
        self.step = ""
        self._closing = False

    def next_timeout(self) -> float:
        if self.left <= 0:
            raise ToolLoopFailed("tool_timeout", f"the record spent its {self.limits.record_timeout_seconds:g} "
                                                 "seconds of tool-server time")
        return min(self.limits.call_timeout_seconds, self.left)

    async def run(self, operation: Awaitable[T]) -> T:
        """Raises TimeoutError past the call's limit (then ``left`` tells whose limit it was)."""
        limit = self.next_timeout()
        started = time.monotonic()
        try:
            with anyio.fail_after(limit):
                return await operation
        finally:
            self.left -= time.monotonic() - started

    def closing(self) -> None:
        """Called on the way out, before the first session is closed: closing them all gets one call's time or
        what is left of the record's, if less. Closing a session sends the server a DELETE (the MCP client's
        courtesy, so the server can free the session), which a stalled server need never answer."""
        if not self._closing:
            self._closing = True
            limit = max(0.0, min(self.limits.call_timeout_seconds, self.left))
            self.setup_scope.deadline = anyio.current_time() + limit

    @contextlib.contextmanager
    def setting_up(self, step: str) -> Iterator[None]:
        """One step of connecting or listing; past its limit ``setup_scope`` ends the whole loop."""
        self.step = step
        self.setup_scope.deadline = anyio.current_time() + self.next_timeout()
        started = time.monotonic()
        try:
            yield
        finally:
            self.setup_scope.deadline = math.inf
            self.left -= time.monotonic() - started
