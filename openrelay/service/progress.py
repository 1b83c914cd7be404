"""Live progress numbers on the batch object: its ``openrelay`` object (docs/api-contract.md §6; what each number
means, and why a poll stays cheap: docs/progress-and-dry-run.md). A running batch's rates come from its own row;
only a queued batch's position costs a read, one per model on a list page."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..clock import seconds
from ..store.batches import Batches
from ..store.db import Database
from ..store.queue import LiveState, live_of_model
from ..store.throughput import WINDOW_SECONDS, window_totals
from ..types import CLAIMABLE_VALUES, RECORDS_MAY_LAND_VALUES, ApiKey, Batch, BatchStatus, unknown_progress
from .batches import get_batch, list_batches

__all__ = ["progress_numbers", "batch_answer", "page_answer", "answer", "numbers"]


def progress_numbers(*, status: str, in_progress_at: int | None, total: int, settled: int,
                     state: LiveState | None, now: float) -> dict[str, Any]:
    """The ``openrelay`` object of a batch in ``status``, with ``settled`` of its ``total`` records done or
    failed; ``state`` is its live state (None for a batch that is not live)."""
    numbers = unknown_progress()
    if state is None or status not in RECORDS_MAY_LAND_VALUES:
        return numbers
    if not state.started:
        numbers["queue_position"] = state.position
        return numbers
    numbers["concurrency_limit"] = state.concurrency_limit
    numbers["yielding"] = state.yielding
    flushed = window_totals(state.window, now) if in_progress_at is not None else None
    if flushed is None or in_progress_at is None:
        return numbers
    span = max(1.0, min(float(WINDOW_SECONDS), now - in_progress_at))
    records_per_second, tokens_per_second = flushed[0] / span, flushed[1] / span
    numbers["records_per_second"] = round(records_per_second, 3)
    numbers["tokens_per_second"] = round(tokens_per_second, 3)
    if status == BatchStatus.IN_PROGRESS.value and records_per_second > 0:
        numbers["eta_seconds"] = math.ceil(max(0, total - settled) / records_per_second)
    return numbers


def numbers(db: Database, found: Sequence[Batch]) -> dict[str, dict[str, Any]]:
    """The ``openrelay`` numbers of each batch record, by id; one read per model among the queued ones."""
    live: dict[str, LiveState] = {}
    for model in sorted({b.model for b in found if b.status is BatchStatus.IN_PROGRESS and not b.started}):
        live.update(live_of_model(db, model))
    now = seconds()
    result = {}
    for batch in found:
        state = None
        if batch.status.value in CLAIMABLE_VALUES:
            state = LiveState(position=None, started=batch.started, window=batch.throughput_window,
                              concurrency_limit=batch.concurrency_limit, yielding=batch.yielding)
            if not batch.started:
                state = live.get(batch.id, state)
        result[batch.id] = progress_numbers(status=batch.status.value, in_progress_at=batch.in_progress_at,
                                            total=batch.total, settled=batch.completed + batch.failed,
                                            state=state, now=now)
    return result


def answer(db: Database, batch: Batch) -> dict[str, Any]:
    """``batch`` as the API shows it, with its ``openrelay`` numbers; reads only when it is queued."""
    shown = batch.as_api()
    shown["openrelay"] = numbers(db, [batch])[batch.id]
    return shown


def batch_answer(batches: Batches, key: ApiKey, batch_id: str) -> dict[str, Any]:
    """``GET /v1/batches/{id}``: the batch with its progress numbers."""
    return answer(batches.db, get_batch(batches, key, batch_id))


def page_answer(batches: Batches, key: ApiKey, **query: Any) -> dict[str, Any]:
    """``GET /v1/batches``: the page, each row with its progress numbers; one read per model of its live rows."""
    page = list_batches(batches, key, **query)
    rows: list[dict[str, Any]] = page["data"]
    live: dict[str, LiveState] = {}
    for model in sorted({row["model"] for row in rows if row["status"] in CLAIMABLE_VALUES}):
        live.update(live_of_model(batches.db, model))
    now = seconds()
    for row in rows:
        counts = row["request_counts"]
        row["openrelay"] = progress_numbers(status=row["status"], in_progress_at=row["in_progress_at"],
                                            total=counts["total"], settled=counts["completed"] + counts["failed"],
                                            state=live.get(row["id"]), now=now)
    return page
