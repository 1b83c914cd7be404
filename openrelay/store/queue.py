"""A queued batch's place in its model's queue, for the live progress numbers (``service/progress.py``).

(The rates come from the batch's own row: ``store/throughput.py``.)

A queued batch's position is where the next claims would take it
(``Batches._next_queued``): per model, every queued expedited batch before any standard one; within a tier the
organization with the fewest batches of the model running first, then the oldest batch. Each batch that starts
adds one to its organization's count, so the claims go round the organizations; ``queue_order`` replays that
from one read of the model's live batches (the ``(status, model)`` index). It assumes no running batch ends
meanwhile: an end can only move a queued batch forward.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..types import BatchStatus, Priority
from .compiled import All, CompiledRead, Plan
from .schema import batches

__all__ = ["LiveBatch", "LiveState", "queue_order", "queue_plan"]

_LIVE = (BatchStatus.IN_PROGRESS.value, BatchStatus.CANCELLING.value, BatchStatus.FINALIZING.value)


@dataclass(frozen=True, slots=True)
class LiveBatch:
    """One live batch of a model, as its queue is replayed from."""

    id: str
    org_id: str
    priority: str
    created_ns: int
    started: bool
    status: str

    @property
    def queued(self) -> bool:
        return not self.started and self.status == BatchStatus.IN_PROGRESS.value


def queue_order(live: Iterable[LiveBatch]) -> dict[str, int]:
    """Each queued batch's position (1 = taken next) among the given live batches of one model."""
    rows = list(live)
    running: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.started:
            running[row.org_id] += 1
    order: list[tuple[int, int, str]] = []
    positions: dict[str, int] = {}
    for tier in (Priority.EXPEDITED.value, Priority.STANDARD.value):
        by_org: dict[str, list[LiveBatch]] = defaultdict(list)
        for row in sorted((r for r in rows if r.queued and r.priority == tier), key=lambda r: (r.created_ns, r.id)):
            by_org[row.org_id].append(row)
        # An organization's k-th queued batch is claimed when k of its batches have started before it: its key is
        # (running + k, created). Each organization's keys rise, so the claims' picks are the keys sorted.
        order = []
        for org, queued in by_org.items():
            order += [(running[org] + k, row.created_ns, row.id) for k, row in enumerate(queued)]
            running[org] += len(queued)  # started before any batch of the next tier
        for _key, _created, batch_id in sorted(order):
            positions[batch_id] = len(positions) + 1
    return positions


@dataclass(frozen=True, slots=True)
class LiveState:
    """What a live batch's progress numbers need beyond its API fields: its place in the queue (None unless
    queued), whether a worker took it, and its rolling record."""

    position: int | None
    started: bool
    window: str | None


def _live_of_model() -> CompiledRead:
    c = batches.c
    live = sa.or_(*(c.status == sa.literal_column(f"'{status}'") for status in _LIVE))
    return CompiledRead(sa.select(c.id, c.org_id, c.priority, c.created_ns, c.started, c.status,
                                  c.throughput_window).where(live, c.model == sa.bindparam("model")))


_LIVE_OF_MODEL = _live_of_model()


def queue_plan(model: str) -> Plan[dict[str, LiveState]]:
    """Every live batch of ``model``, by id, with its queue position (``queue_order``): one read."""
    rows: list[tuple[Any, ...]] = yield All(_LIVE_OF_MODEL, {"model": model})
    positions = queue_order(LiveBatch(id=r[0], org_id=r[1], priority=r[2], created_ns=int(r[3]),
                                      started=bool(r[4]), status=r[5]) for r in rows)
    return {r[0]: LiveState(position=positions.get(r[0]), started=bool(r[4]), window=r[6]) for r in rows}
