"""A queued batch's place in its model's queue, for the live progress numbers (``service/progress.py``): the claims'
own order (``BatchLeases._next_queued``: expedited first, then fair share, ``store/fair_share.py``) replayed from one
read of the model's live batches. docs/progress-and-dry-run.md, "The queue's order"."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..types import CLAIMABLE_VALUES, BatchStatus, Priority
from .db import Database
from .fair_share import NEVER_STARTED
from .schema import batches, model_shares

__all__ = ["LiveBatch", "LiveState", "queue_order", "live_of_model"]

_CLAIMABLE = CLAIMABLE_VALUES


class LiveBatch(NamedTuple):
    """One live batch of a model, as its queue is replayed from: the first columns of a row of ``live_of_model``."""

    id: str
    org_id: str
    priority: str
    created_ns: int
    started: bool
    status: str
    org_last_start: float | None = None  # its organization's turn at the model (``model_shares``); None: never


_IN_PROGRESS = BatchStatus.IN_PROGRESS.value
_EXPEDITED = Priority.EXPEDITED.value


def queue_order(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Each queued batch's position (1 = taken next) among the live batches of one model (``LiveBatch``, or rows
    that begin as one does)."""
    running: dict[str, int] = {}
    turns: dict[str, tuple[int, float]] = {}  # (0, the stored turn); a start replayed here: (1, its place)
    expedited: list[tuple[int, str, str]] = []
    standard: list[tuple[int, str, str]] = []
    for row in rows:
        org = row[1]
        if org not in turns:
            turns[org] = (0, NEVER_STARTED if row[6] is None else row[6])
        if row[4]:
            running[org] = running.get(org, 0) + 1
        elif row[5] == _IN_PROGRESS:
            (expedited if row[2] == _EXPEDITED else standard).append((row[3], row[0], org))
    positions: dict[str, int] = {}
    for tier in (expedited, standard):
        # Each claim takes the head of the organization with the least key (running, turn, its head's age); only
        # the taken one's key changes (one more running, its turn to the back), so a heap of heads replays them.
        queues: dict[str, deque[tuple[int, str]]] = {}
        for created_ns, batch_id, org in sorted(tier):
            queues.setdefault(org, deque()).append((created_ns, batch_id))
        heads = [(running.get(org, 0), turns[org], queue[0][0], org) for org, queue in queues.items()]
        heapq.heapify(heads)
        while heads:
            org = heapq.heappop(heads)[3]
            queue = queues[org]
            positions[queue.popleft()[1]] = len(positions) + 1
            running[org] = running.get(org, 0) + 1
            turns[org] = (1, len(positions))
            if queue:
                heapq.heappush(heads, (running[org], turns[org], queue[0][0], org))
    return positions


class LiveState(NamedTuple):
    """What a live batch's progress numbers need beyond its API fields: its place in the queue (None unless
    queued), whether a worker took it, its rolling record, and the concurrency limit its worker last wrote."""

    position: int | None
    started: bool
    window: str | None
    concurrency_limit: int | None = None
    yielding: bool = False


def _live_of_model() -> sa.Select:
    c = batches.c
    live = sa.or_(*(c.status == sa.literal_column(f"'{status}'") for status in _CLAIMABLE))
    turns = batches.outerjoin(model_shares, sa.and_(model_shares.c.model == c.model,
                                                   model_shares.c.org_id == c.org_id))
    return (sa.select(c.id, c.org_id, c.priority, c.created_ns, c.started, c.status, model_shares.c.last_started_at,
                      c.throughput_window, c.concurrency_limit, c.yielding)
            .select_from(turns).where(live, c.model == sa.bindparam("model")))


_LIVE_OF_MODEL = _live_of_model()


def live_of_model(db: Database, model: str) -> dict[str, LiveState]:
    """Every live batch of ``model``, by id, with its queue position (``queue_order``): one read."""
    with db.read() as conn:
        rows = conn.execute(_LIVE_OF_MODEL, {"model": model}).all()
    positions = queue_order(rows)
    get = positions.get
    return {r[0]: LiveState(get(r[0]), bool(r[4]), r[7], r[8], bool(r[9])) for r in rows}
