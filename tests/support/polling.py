"""Waiting on a signal: poll until a check holds, or until a batch has ended. Deadlines only guard against a hang;
no test waits a fixed time for something to happen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from openrelay.types import TERMINAL  # a batch in one of these has ended (StrEnums: the API's strings match)

__all__ = ["TERMINAL", "wait_for", "wait_for_async", "status_of", "until_terminal"]

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 60.0, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


async def wait_for_async(check: Callable[[], T | None], what: str, timeout: float = 60.0, every: float = 0.002) -> T:
    """``wait_for`` inside an event loop (an engine double's handler waiting for the worker to see something)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)


def status_of(batch: Any) -> str:
    """A batch's status, read from the API's JSON (a dict) or from an ``openai`` SDK ``Batch``."""
    return batch["status"] if isinstance(batch, dict) else batch.status


def until_terminal(read: Callable[[], T], what: str = "the batch", *, timeout: float = 120.0, every: float = 0.05,
                   meanwhile: Callable[[], object] | None = None) -> T:
    """Call ``read`` (it returns one batch, as a dict or an SDK ``Batch``) until the batch has ended; return it.
    ``meanwhile`` runs between two reads (say, letting held engine requests through)."""
    deadline = time.monotonic() + timeout
    while True:
        batch = read()
        if status_of(batch) in TERMINAL:
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not ended after {timeout}s: {batch}")
        if meanwhile is not None:
            meanwhile()
        time.sleep(every)
