"""Poll answers kept briefly: the bytes of ``GET /v1/batches/{id}`` and of a page of ``GET /v1/batches``, per key and
URL, for ``OPENRELAY_POLL_CACHE_SECONDS`` after the read that made them began. A write of this process to an
organization's batches forgets that organization's answers at once (``http/writes.OrgWrites``), and so does a read
that began before such a write: it keeps nothing. Polls that miss while the same answer is being read wait for
that read instead of reading again. Why, and what it buys: docs/design.md, "Reading the store"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["PollCache"]

_LONGEST_TARGET = 2048  # a URL longer than any an SDK polls with is answered, never kept
_MOST_ORGS = 100_000  # organizations whose writes are counted; past it, counting starts afresh

Written = tuple[int, int]  # (epoch, an organization's writes): what a kept answer was read under


class PollCache:
    """Answers by (key id, URL), each with its organization's write count when its read began; used only while
    that count holds and less than ``seconds`` after the read began. At most ``max_bytes`` of answers: past that,
    the expired go, then all. Used by the event loop only."""

    def __init__(self, seconds: float, *, max_bytes: int = 16 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._max_bytes = max_bytes
        self._clock = clock
        self._bytes = 0
        self._answers: dict[tuple[str, str], tuple[str, Written, float, bytes]] = {}
        self._reading: dict[tuple[str, str], tuple[str, asyncio.Task[bytes]]] = {}  # (org, read) by (key, URL)
        self._writes: dict[str, int] = {}
        self._epoch = 0  # counted afresh after the counts are dropped (``_MOST_ORGS``)

    async def answer(self, key_id: str, org_id: str, target: str, read: Callable[[], Awaitable[bytes]]) -> bytes:
        """The answer kept for ``key_id`` and ``target``, or the one ``read()`` makes: one read at a time per key
        and URL, which every poll that misses meanwhile shares (not past a write of the organization)."""
        found = self.get(key_id, target)
        if found is not None:
            return found
        if self._seconds <= 0:
            return await read()
        reading = self._reading.get((key_id, target))
        if reading is None:
            task = asyncio.ensure_future(self._read(key_id, org_id, target, read))
            task.add_done_callback(_retrieved)  # its error reaches every poll that waits; none may be left
            reading = self._reading[(key_id, target)] = (org_id, task)
        return await asyncio.shield(reading[1])  # a poll that goes away leaves the read to the others

    async def _read(self, key_id: str, org_id: str, target: str, read: Callable[[], Awaitable[bytes]]) -> bytes:
        token = self.token(org_id)
        try:
            body = await read()
        finally:
            if self._reading.get((key_id, target), ("", None))[1] is asyncio.current_task():
                del self._reading[(key_id, target)]
        self.put(key_id, org_id, target, token, body)
        return body

    def _written(self, org_id: str) -> Written:
        return self._epoch, self._writes.get(org_id, 0)

    def token(self, org_id: str) -> tuple[Written, float]:
        """Taken just before a read: the organization's writes so far and the time."""
        return self._written(org_id), self._clock()

    def get(self, key_id: str, target: str) -> bytes | None:
        found = self._answers.get((key_id, target))
        if found is None or found[1] != self._written(found[0]) or self._clock() >= found[2]:
            return None
        return found[3]

    def put(self, key_id: str, org_id: str, target: str, token: tuple[Written, float], body: bytes) -> None:
        """Keep ``body``, read under ``token``, unless the organization was written since."""
        if self._seconds <= 0 or len(target) > _LONGEST_TARGET or token[0] != self._written(org_id):
            return
        if self._bytes + len(body) > self._max_bytes:
            now = self._clock()
            self._answers = {k: v for k, v in self._answers.items() if v[2] > now}
            self._bytes = sum(len(v[3]) for v in self._answers.values())
            if self._bytes + len(body) > self._max_bytes:
                self._answers.clear()
                self._bytes = 0
        old = self._answers.pop((key_id, target), None)
        self._bytes += len(body) - (len(old[3]) if old else 0)
        self._answers[(key_id, target)] = (org_id, token[0], token[1] + self._seconds, body)

    def forget(self, org_id: str) -> None:
        """A write of this process to ``org_id``'s batches: its answers, and reads in flight, are not used."""
        self._reading = {k: v for k, v in self._reading.items() if v[0] != org_id}
        if len(self._writes) >= _MOST_ORGS:
            self._writes.clear()
            self._epoch += 1
        self._writes[org_id] = self._writes.get(org_id, 0) + 1


def _retrieved(task: asyncio.Task[bytes]) -> None:
    if not task.cancelled():
        task.exception()
