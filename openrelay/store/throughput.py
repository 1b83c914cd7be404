"""A running batch's rolling record of its last minute's durable flushes (``batches.throughput_window``), which the
live progress numbers' rates are read from (``service/progress.py``).

Each durable chunk adds its records and tokens to the bucket of the second it was committed in, in the chunk's
own transaction (``Results.commit_chunk`` calls ``add_flush``); buckets older than ``WINDOW_SECONDS`` are dropped
as it is rewritten, so it holds at most ``WINDOW_SECONDS + 1`` small buckets however long the batch runs or however
often it flushes. A poll reads it with the batch's row, which it reads anyway: the rates cost no query. The
seconds are the machines' clocks (``clock.seconds``) on both sides: a worker's skew against the reading API process
moves the window by as much.
"""

from __future__ import annotations

import math

import orjson

__all__ = ["WINDOW_SECONDS", "add_flush", "window_totals"]

WINDOW_SECONDS = 60  # the rates are over the last minute


def add_flush(window: str | None, at: float, records: int, tokens: int) -> str:
    """The rolling record ``window`` with a flush of ``records`` and ``tokens`` at ``at`` added, older buckets
    dropped."""
    second = int(at)
    kept = [b for b in (orjson.loads(window) if window else ()) if b[0] > second - WINDOW_SECONDS]
    if kept and kept[-1][0] == second:
        kept[-1] = [second, kept[-1][1] + records, kept[-1][2] + tokens]
    else:
        kept.append([second, records, tokens])
    return orjson.dumps(kept).decode()


def window_totals(window: str | None, now: float) -> tuple[int, int] | None:
    """(records, tokens) flushed in the last ``WINDOW_SECONDS`` before ``now``; None when nothing was ever
    flushed (the rates are unknown, not zero)."""
    if not window:
        return None
    floor = math.floor(now) - WINDOW_SECONDS
    records = tokens = 0
    for second, r, t in orjson.loads(window):
        if second > floor:
            records += r
            tokens += t
    return records, tokens
