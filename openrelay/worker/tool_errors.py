"""How a tool loop ends when it fails: ``ToolLoopFailed`` (its codes: docs/tool-calling.md), and the mapping of
whatever crossed the MCP sessions' task groups (exception groups, chained causes) to the one failure the record
ends with."""

from __future__ import annotations

import logging
from typing import TypeVar

from ..egress import BlockedAddress

__all__ = ["ToolLoopFailed", "failure_of_group", "failure_of", "found_in", "describe"]

T = TypeVar("T")

log = logging.getLogger("openrelay.worker")


class ToolLoopFailed(Exception):
    """The record ends as an error line with this code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    """The exceptions inside ``group``, however deeply nested."""
    return [leaf for exc in group.exceptions
            for leaf in (_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])]


def failure_of_group(group: BaseExceptionGroup, model_errors: list[BaseException]) -> BaseException:
    """What the record ends with for an exception group out of the sessions' task groups: the worker's exception
    from a model call (or a BaseException) first, then the loop's own ``ToolLoopFailed``; anything else was a
    tool server's connection."""
    leaves = _leaves(group)
    for wanted in (lambda e: e in model_errors or not isinstance(e, Exception),
                   lambda e: isinstance(e, ToolLoopFailed)):
        found = next((leaf for leaf in leaves if wanted(leaf)), None)
        if found is not None:
            return found
    blocked = found_in(group, BlockedAddress)  # a later connection of a session whose host now resolves elsewhere
    if blocked is not None:
        return ToolLoopFailed("tool_server_not_allowed", f"a tool server {blocked}; it is never contacted")
    return ToolLoopFailed("tool_server_unavailable", f"a tool server connection failed: {describe(leaves[0])}")


def failure_of(exc: Exception, model_errors: list[BaseException]) -> Exception:
    """What the record ends with for ``exc``: the loop's own ``ToolLoopFailed`` and the worker's exceptions from
    its model calls as they are; anything else went wrong talking to a tool server (an exception the MCP SDK or
    the HTTP client let through), and ends only this record."""
    if isinstance(exc, ToolLoopFailed) or exc in model_errors:
        return exc
    log.warning("tool loop: unexpected %s", exc.__class__.__name__, exc_info=exc)
    return ToolLoopFailed("tool_server_unavailable", f"talking to a tool server failed: {describe(exc)}")


def found_in(exc: BaseException, kind: type[T]) -> T | None:
    """An exception of ``kind`` in ``exc``, in the groups it is part of or in the chain of causes."""
    seen: list[BaseException] = [exc]
    while seen:
        current = seen.pop()
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            seen += current.exceptions
        seen += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        exc = _leaves(exc)[0]
    return str(exc) or exc.__class__.__name__
