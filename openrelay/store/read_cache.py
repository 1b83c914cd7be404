"""Poll answers kept in memory while PostgreSQL says nothing they read has changed.

A client polling ``GET /v1/batches/{id}`` asks the same question many times between two changes of the answer,
and on PostgreSQL each ask is a round trip whose client-side cost alone is several times the HTTP stack's
(docs/benchmarks.md). So the rows of the reads marked ``cache_by`` (``store.compiled``: the batch by id, a page,
a page's anchor: reads of one organization's ``batches`` and ``batch_tags``) are kept here and reused, for as
long as nothing of that organization has changed.

What changed is told by the database itself, so it holds for every process on every machine: a trigger on both
tables (migration 0010) sends ``NOTIFY openrelay_batches, '<org_id>'`` in the transaction of every insert, update
and delete, and PostgreSQL delivers it when that transaction commits. One connection of this process LISTENs and
bumps the organization's generation for each notice; a kept answer is used only while the generations it was read
under are still the current ones. A read captures its generations before it asks the server and keeps its rows
only if they are unchanged when the rows come back, so an answer read across a commit is never kept past that
commit's notice. A request of this process that writes an organization's batches (a create, a cancel, an edit)
forgets that organization's kept reads as it returns (``api.app``): a client that cancels and then polls the same
process sees its own cancel without waiting for the notice.

Across processes an answer may lag a commit by the notice's delivery (a millisecond on a LAN); while the listening
connection is down (a restart, a failover), nothing is kept or reused, every poll reads the server, and
everything kept before is dropped once the listener is back. A listening connection that goes silent without
closing (a cut network) is found by TCP keepalives within ``KEEPALIVE_SECONDS``.

Memory is bounded: at most 20,000 kept rows (``KeptRows``), the oldest dropped first, and a generation for at most
100,000 organizations (past that, everything is forgotten and counting starts afresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import psycopg

from ..metrics import POLL_READS

__all__ = ["KeptRows", "ReadCache", "CHANNEL", "Token", "POLL_KEPT", "POLL_SERVER"]

log = logging.getLogger("openrelay.store")

CHANNEL = "openrelay_batches"
KEEPALIVE_SECONDS = 15  # idle 5 s, then 5 probes 2 s apart
_RETRY_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_MOST_ORGS = 100_000
POLL_KEPT, POLL_SERVER = POLL_READS.labels("kept"), POLL_READS.labels("server")

# The generations a read was made under: the listener's (bumped each time it starts afresh) and its
# organization's (bumped by notices and by this process's own writes). Everything here runs on the event loop.
Token = tuple[int, int]


class KeptRows:
    """Rows of reads by (read, parameters), each with the token it was read under: at most ``max_rows`` rows in
    all (a batch's read is one, a page's up to 101), the least recently kept dropped first. A row of a batch is
    about a kilobyte in memory, so the default holds about 20 MB. Used on the event loop only."""

    def __init__(self, max_rows: int = 20_000) -> None:
        self._max_rows = max_rows
        self._rows = 0
        self._entries: OrderedDict[Hashable, tuple[Hashable, Any, int]] = OrderedDict()

    def get(self, key: Hashable, token: Hashable | None) -> tuple[bool, Any]:
        """(True, rows) when ``key``'s rows were kept under ``token``, else (False, None)."""
        found = self._entries.get(key)
        if found is None or token is None or found[0] != token:
            return False, None
        return True, found[1]

    def put(self, key: Hashable, token: Hashable, rows: Any) -> None:
        """Keep ``rows`` (a row, None, or a tuple of rows) of ``key`` under ``token``."""
        entries = self._entries
        weight = len(rows) if type(rows) is tuple and rows and type(rows[0]) is tuple else 1
        old = entries.pop(key, None)
        if old is not None:
            self._rows -= old[2]
        entries[key] = (token, rows, weight)
        self._rows += weight
        while self._rows > self._max_rows and entries:
            self._rows -= entries.popitem(last=False)[1][2]

    def clear(self) -> None:
        self._entries.clear()
        self._rows = 0


class ReadCache:
    """Rows of org-scoped reads on PostgreSQL, valid while the generations they were read under hold."""

    def __init__(self, url: str, *, enabled: bool = True) -> None:
        self._url = url
        self._enabled = enabled  # off: it never listens, so nothing is kept (OPENRELAY_POLL_CACHE=0)
        self._entries = KeptRows()
        self._orgs: dict[str, int] = {}
        self._generation = 0
        self.listening = False  # True only while notices are being received
        self._task: asyncio.Task[None] | None = None

    # -- reads (on the event loop) --------------------------------------------------------------------------------

    def token(self, org_id: str) -> Token | None:
        """The generations to read ``org_id``'s rows under; None while no notice can be received."""
        if not self.listening:
            return None
        return self._generation, self._orgs.get(org_id, 0)

    def get(self, key: Hashable, org_id: str) -> tuple[bool, Any]:
        """(True, rows) when ``key``'s rows are kept and still current, else (False, None)."""
        return self._entries.get(key, self.token(org_id))

    def put(self, key: Hashable, org_id: str, token: Token | None, rows: Any) -> None:
        """Keep ``rows``, read under ``token``, if nothing has changed since the token was taken."""
        if token is not None and token == self.token(org_id):
            self._entries.put(key, token, rows)

    # -- changes ------------------------------------------------------------------------------------------------

    def changed(self, org_id: str) -> None:
        """Something of ``org_id`` changed (a notice, or a write of this process)."""
        orgs = self._orgs
        orgs[org_id] = orgs.get(org_id, 0) + 1
        if len(orgs) > _MOST_ORGS:
            self._forget()  # start afresh rather than remember a generation for every organization there is

    # -- the listener -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start listening (on the running loop); reads are not kept until the first LISTEN is in place."""
        if self._task is None and self._enabled:
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="openrelay-read-cache")

    async def _listen(self) -> None:
        attempt = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, application_name="openrelay-read-cache", connect_timeout=5,
                    keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=5)
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    # Every answer kept under an earlier listener may have missed a notice: start afresh.
                    self._forget()
                    self.listening = True
                    attempt = 0
                    async for notice in conn.notifies():
                        self.changed(notice.payload)
            except psycopg.Error as exc:
                log.info("the read cache's listener is down (%s); polls read the server until it is back", exc)
            finally:
                self.listening = False
                self._forget()
            await asyncio.sleep(_RETRY_SECONDS[min(attempt, len(_RETRY_SECONDS) - 1)])
            attempt += 1

    def _forget(self) -> None:
        self._generation += 1
        self._entries.clear()
        self._orgs.clear()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
