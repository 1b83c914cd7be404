"""The order a running batch's records go out in: prefix groups back to back, each warmed by one record (its
leader) first, and groups other batches of the same model are sending first. A batch with no stored order runs in
input order. How and why: docs/engines.md, "Prefix grouping"."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any

from ..blobs.base import BlobMissing, BlobStore
from ..blobs.keys import dispatch_order_key
from ..prefix import read_entries
from ..types import Batch
from .inputs import Unreadable, load_record, pending_records

__all__ = ["DispatchQueue", "ModelGroups", "Pending"]

Pending = tuple[int, "dict[str, Any] | Unreadable", int]  # (line, record, prefix group; 0: none)

_WINDOW_RECORDS = 64  # bodies fetched in one range read, at most ...
_WINDOW_BYTES = 4 << 20  # ... and this many bytes of them (one record more when a single one is larger)
# Groups of one run warming or with records still to send, at once (a quarter of its in flight, 1 to 4): more push
# each other out of a small cache (bench_scheduling at 16 lanes: 4 best; docs/engines.md).
_MAX_WARMING = 4


def warming_allowed(in_flight: int) -> int:
    return max(1, min(_MAX_WARMING, in_flight // 4))


# A group counts as warm this long after an answer of it: long enough for another batch of the model to follow it,
# too short to trust a cache that other work has gone through since (taking a cold group for warm costs the most).
_WARM_SECONDS = 2.0


class ModelGroups:
    """One model's prefix groups in a worker process, over all its batches: how many records of each are in flight
    now, and which groups had an answer lately (their prefix is likely still in the engine's cache)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counts: dict[int, int] = {}
        self._answered: OrderedDict[int, float] = OrderedDict()  # group: when its last answer came, oldest first

    def started(self, group: int) -> None:
        if group:
            self._counts[group] = self._counts.get(group, 0) + 1

    def finished(self, group: int) -> None:
        if group:
            left = self._counts[group] - 1
            if left:
                self._counts[group] = left
            else:
                del self._counts[group]
            now = self._clock()
            self._answered[group] = now
            self._answered.move_to_end(group)
            while self._answered and next(iter(self._answered.values())) < now - _WARM_SECONDS:
                self._answered.popitem(last=False)

    def hot(self) -> list[int]:
        return list(self._counts)

    def is_warm(self, group: int) -> bool:
        answered = self._answered.get(group)
        return answered is not None and answered >= self._clock() - _WARM_SECONDS


class DispatchQueue:
    """The records of one run still to send, taken one at a time by the run's lanes (``take``); a lane reports
    each record's end (``done``), which lets a warmed group's other records go."""

    def __init__(self, blobs: BlobStore, batch: Batch, skip: set[int], max_line_bytes: int, *, grouping: bool,
                 groups: ModelGroups | None = None, in_flight: Callable[[], int]) -> None:
        self.blobs = blobs
        self.batch = batch
        self.skip = skip
        self.max_line_bytes = max_line_bytes
        self.grouping = grouping
        self.groups = groups or ModelGroups()
        self.in_flight = in_flight  # how many requests the run may have out now (its concurrency, or the limit)
        self._lock = asyncio.Lock()
        self._released = asyncio.Event()
        self._ready: list[Pending] = []  # fetched bodies, the next one last
        self._input_order: Iterator[tuple[int, dict[str, Any] | Unreadable]] | None = None
        # The stored order, as compact columns of the records left to send; runs of one group are contiguous.
        self._lines = array("I")
        self._offsets = array("Q")
        self._lengths = array("I")
        self._groups = array("Q")
        self._run_starts = array("I")  # index of each run's first record; a run is one group (or one ungrouped)
        self._run_taken = bytearray()
        self._runs_of_group: dict[int, list[int]] = {}
        self._next_run = 0  # the first run in the stored order that may still be untaken
        self._open: deque[tuple[int, int]] = deque()  # index ranges that may go now
        self._parked: dict[int, list[tuple[int, int]]] = {}  # a warming group's records, waiting for its leader
        self._live: dict[int, int] = {}  # groups sent a leader of: their records not handed out yet
        self._out = 0  # records handed out whose end (done) has not come yet
        self._loaded = False

    async def take(self) -> Pending | None:
        """The next record to send, or None when every record has been taken. It waits while as many of the
        run's records are out as it may have in flight (more lanes than that, with an adaptive limit), so that
        which record goes next is decided when it can go: a group's leader goes ahead of records taken earlier."""
        async with self._lock:
            # One at the least: with every replica out of rotation (a limit of 0) a record still goes to wait for
            # one, where a cancel or the window's end stops it.
            while self._out >= max(1, self.in_flight()):
                self._released.clear()
                await self._released.wait()
            item = await self._next()
            if item is not None:
                self._out += 1
            return item

    async def _next(self) -> Pending | None:
        if not self._loaded:
            await asyncio.to_thread(self._load)
        if self._input_order is not None:
            item = next(self._input_order, None)
            return None if item is None else (item[0], item[1], 0)
        while True:
            allowed = warming_allowed(self.in_flight())
            if len(self._live) < allowed and (leader := await self._lead_next()) is not None:
                return leader  # ahead of the records ready: it warms while they go
            if self._ready:
                return self._hand_out()
            if self._open:
                self._ready = await self._read(self._window())
                self._ready.reverse()
                continue
            run = self._next_run_index()
            if run is not None and not self._needs_leader(run):
                self._open.append(self._take_run(run))
                continue
            if not self._parked:
                return None
            self._released.clear()
            await self._released.wait()

    def done(self, group: int) -> None:
        """A record of ``group`` has its answer (or ended without one): a group it led may go now, first."""
        self._out -= 1
        ranges = self._parked.pop(group, None)
        if ranges:
            self._open.extendleft(reversed(ranges))
        self._released.set()

    def close(self) -> None:
        if self._input_order is not None:
            self._input_order.close()  # type: ignore[attr-defined]  # a generator: its input file closes

    # -- the stored order ---------------------------------------------------------------------------------------

    def _load(self) -> None:
        self._loaded = True
        if self.grouping:
            try:
                with self.blobs.open(dispatch_order_key(self.batch.id)) as handle:
                    self._read_order(handle)
                return
            except BlobMissing:
                pass
        self._input_order = pending_records(self.blobs, self.batch, self.skip, self.max_line_bytes)

    def _read_order(self, handle: Any) -> None:
        previous: int | None = None
        for entry in read_entries(handle):
            if entry.line in self.skip:
                continue
            index = len(self._lines)
            self._lines.append(entry.line)
            self._offsets.append(entry.offset)
            self._lengths.append(entry.length)
            self._groups.append(entry.group)
            if entry.group == 0 or entry.group != previous:
                run = len(self._run_starts)
                self._run_starts.append(index)
                if entry.group:
                    self._runs_of_group.setdefault(entry.group, []).append(run)
            previous = entry.group
        self._run_taken = bytearray(len(self._run_starts))

    def _take_run(self, run: int) -> tuple[int, int]:
        self._run_taken[run] = 1
        end = self._run_starts[run + 1] if run + 1 < len(self._run_starts) else len(self._lines)
        return self._run_starts[run], end

    def _next_run_index(self) -> int | None:
        """A group another batch of the model sends now, else the next untaken run in the stored order."""
        for group in self.groups.hot():
            for run in self._runs_of_group.get(group, ()):
                if not self._run_taken[run]:
                    return run
        while self._next_run < len(self._run_starts) and self._run_taken[self._next_run]:
            self._next_run += 1
        return self._next_run if self._next_run < len(self._run_starts) else None

    def _window(self) -> list[int]:
        """Indexes of the next records to fetch from the open ranges: up to a window's worth."""
        window: list[int] = []
        size = 0
        while self._open and len(window) < _WINDOW_RECORDS and size < _WINDOW_BYTES:
            start, end = self._open.popleft()
            while start < end and len(window) < _WINDOW_RECORDS and size < _WINDOW_BYTES:
                window.append(start)
                size += self._lengths[start]
                start += 1
            if start < end:
                self._open.appendleft((start, end))
        return window

    def _needs_leader(self, run: int) -> bool:
        """Whether the run is a group of several records that the engine has not seen lately."""
        start = self._run_starts[run]
        end = self._run_starts[run + 1] if run + 1 < len(self._run_starts) else len(self._lines)
        group = self._groups[start]
        return end - start > 1 and group != 0 and not self.groups.is_warm(group)

    async def _lead_next(self) -> Pending | None:
        """The leader of the next run if that is a group to warm: its other records wait for its answer."""
        run = self._next_run_index()
        if run is None or not self._needs_leader(run):
            return None
        start, end = self._take_run(run)
        group = self._groups[start]
        self._parked.setdefault(group, []).append((start + 1, end))
        self._live[group] = self._live.get(group, 0) + end - start - 1
        return (await self._read([start]))[0]

    def _hand_out(self) -> Pending:
        item = self._ready.pop()
        group = item[2]
        left = self._live.get(group)
        if left is not None:
            if left > 1:
                self._live[group] = left - 1
            else:
                del self._live[group]  # all of it sent: the next group may start warming
        return item

    async def _read(self, window: list[int]) -> list[Pending]:
        ranges = [(self._offsets[i], self._lengths[i]) for i in window]
        bodies = await asyncio.to_thread(self.blobs.read_ranges, self.batch.input_blob_key, ranges)
        return [(self._lines[i], load_record(raw), self._groups[i]) for i, raw in zip(window, bodies, strict=True)]
