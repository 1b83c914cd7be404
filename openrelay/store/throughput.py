"""A running batch's rolling record of its last minute's durable flushes (``batches.throughput_window``), which the
live progress numbers' rates are read from: one bucket per second, written in each chunk's own transaction
(``Results.commit_chunk`` calls ``add_flush``), at most ``WINDOW_SECONDS + 1`` however long the batch runs.
docs/progress-and-dry-run.md, "Where the rates come from"."""

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
