"""A queued batch's place in its model's queue, for the live progress numbers (``service/progress.py``).

(The rates come from the batch's own row: ``store/throughput.py``.)

A queued batch's position is where the next claims would take it (``BatchLeases._next_queued``,
store/leases.py): per model, every queued expedited batch before any standard one; within a tier the
organization with the fewest batches of the model running first, then the oldest batch. Each batch that starts
adds one to its organization's count, so the claims go round the organizations; ``queue_order`` replays that
from one read of the model's live batches (the ``(status, model)`` index). It assumes no running batch ends
meanwhile: an end can only move a queued batch forward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..types import CLAIMABLE_VALUES, BatchStatus, Priority
from .compiled import AllRows, CompiledRead, Plan
from .schema import batches

__all__ = ["LiveBatch", "LiveState", "queue_order", "queue_plan"]

_CLAIMABLE = CLAIMABLE_VALUES


@dataclass(frozen=True, slots=True)
class LiveBatch:
    """One live batch of a model, as its queue is replayed from."""

    id: str
    org_id: str
    priority: str
    created_ns: int
    started: bool
    status: str


_IN_PROGRESS = BatchStatus.IN_PROGRESS.value
_EXPEDITED = Priority.EXPEDITED.value


def queue_order(live: Iterable[LiveBatch]) -> dict[str, int]:
    """Each queued batch's position (1 = taken next) among the given live batches of one model."""
    return _positions([(b.id, b.org_id, b.priority, b.created_ns, b.started, b.status) for b in live])


def _positions(rows: Sequence[Sequence[Any]]) -> dict[str, int]:
    """``queue_order`` of rows that begin (id, org_id, priority, created_ns, started, status): plain tuples, since
    a poll of a queued batch runs this over every live batch of its model."""
    running: dict[str, int] = {}
    expedited: list[tuple[int, str, str]] = []
    standard: list[tuple[int, str, str]] = []
    for row in rows:
        if row[4]:
            running[row[1]] = running.get(row[1], 0) + 1
        elif row[5] == _IN_PROGRESS:
            (expedited if row[2] == _EXPEDITED else standard).append((row[3], row[0], row[1]))
    positions: dict[str, int] = {}
    for tier in (expedited, standard):
        tier.sort()
        # An organization's k-th queued batch is claimed when k of its batches have started before it: its key is
        # (running + k, created). Each organization's keys rise, so the claims' picks are the keys sorted.
        taken: dict[str, int] = {}
        keys = []
        for created_ns, batch_id, org in tier:
            k = taken.get(org, 0)
            taken[org] = k + 1
            keys.append((running.get(org, 0) + k, created_ns, batch_id))
        for org, k in taken.items():
            running[org] = running.get(org, 0) + k  # started before any batch of the next tier
        keys.sort()
        for _key, _created, batch_id in keys:
            positions[batch_id] = len(positions) + 1
    return positions


class LiveState(NamedTuple):
    """What a live batch's progress numbers need beyond its API fields: its place in the queue (None unless
    queued), whether a worker took it, its rolling record, and the concurrency limit its worker last wrote."""

    position: int | None
    started: bool
    window: str | None
    concurrency_limit: int | None = None


def _live_of_model() -> CompiledRead:
    c = batches.c
    live = sa.or_(*(c.status == sa.literal_column(f"'{status}'") for status in _CLAIMABLE))
    return CompiledRead(sa.select(c.id, c.org_id, c.priority, c.created_ns, c.started, c.status, c.throughput_window,
                                  c.concurrency_limit).where(live, c.model == sa.bindparam("model")))


_LIVE_OF_MODEL = _live_of_model()


def queue_plan(model: str) -> Plan[dict[str, LiveState]]:
    """Every live batch of ``model``, by id, with its queue position (``queue_order``): one read."""
    rows: list[tuple[Any, ...]] = yield AllRows(_LIVE_OF_MODEL, {"model": model})
    positions = _positions(rows)
    get = positions.get
    return {r[0]: LiveState(get(r[0]), bool(r[4]), r[6], r[7]) for r in rows}
