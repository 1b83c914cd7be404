"""The one wall clock: every stamp, and every deadline one process judges alone, reads it; a test moves it by
replacing ``read_ns``. Deadlines that machines share (leases, claims, the sweeper's turn) are judged by the
database's clock (``Database.clock``) instead, and a duration within one process (a backoff, a latency, a heartbeat's
spacing) by ``time.monotonic()``, which a wall clock set back or forward cannot break."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["now", "now_ns", "seconds", "read_ns"]

read_ns: Callable[[], int] = time.time_ns  # nanoseconds since the epoch


def now() -> int:
    """Whole seconds since the epoch: the API's ``created_at`` and every stamp stored as one."""
    return read_ns() // 1_000_000_000


def now_ns() -> int:
    return read_ns()


def seconds() -> float:
    return read_ns() / 1e9
