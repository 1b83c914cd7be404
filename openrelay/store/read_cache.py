"""Poll answers kept in memory while PostgreSQL says nothing they read has changed, and never longer than
``KEEP_SECONDS``: the process that writes an organization's batches NOTIFYs it after its commit
(``store/notices.py``), one LISTEN per process bumps that organization's generation; a write of this process
forgets its organization's reads at once (``http/writes.OrgWrites``, told by ``api/context.py``). Bounded to 16 MiB
of rows. How it stays correct across processes, outages and a writer killed before its notice: docs/design.md, "The
poll read cache"."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import psycopg

from ..backoff import Backoff
from ..metrics import POLL_READS
from .notices import CHANNEL

__all__ = ["KeptRows", "ReadCache", "Token", "KEEP_SECONDS", "POLL_KEPT", "POLL_SERVER"]

log = logging.getLogger("openrelay.store")

PROBE_SECONDS = 5.0  # a listener whose own notice has not come back within this long is taken as down
_PROBE = " probe "  # starts a probe's payload; no organization id holds a space
_RELISTEN = Backoff(base=0.1, cap=30.0)  # the wait before listening again: 0.1 s after a listen that heard, doubling
_MOST_ORGS = 100_000
LONGEST_PARAMETER = 600  # characters: an id, a tag (at most 512), a model name; a longer one is kept by no read
POLL_KEPT, POLL_SERVER = POLL_READS.labels("kept"), POLL_READS.labels("server")

# Kept rows are used for at most this long after the read that fetched them began, notices or not: the bound on
# what a poll may miss when a notice never comes (its writer killed between its commit and its notice, a notice
# lost with its connection, a write by a tool that sends none). docs/guarantees.md, "Polls".
KEEP_SECONDS = 1.0

# The generations a read was made under: the listener's (bumped each time it starts afresh) and its
# organization's (bumped by notices and by this process's own writes), and the clock when it was taken (just
# before the read): its rows are kept until ``KEEP_SECONDS`` after that. Everything here runs on the event loop.
Token = tuple[int, int, float]


class KeptRows:
    """Rows of reads by (read, parameters), each with the token it was read under and the time it may be used
    until, weighing at most ``max_bytes`` in all (each entry its values' lengths, and 64 per value and row besides),
    the least recently kept dropped first. Used by one thread (the event loop, or SQLite's reader) only."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[Hashable, tuple[Hashable, Any, int, float]] = OrderedDict()

    @staticmethod
    def key(read: Any, params: Mapping[str, Any]) -> Hashable | None:
        """The entry of ``read`` with ``params``, or None when a parameter is too long to be worth keeping."""
        for value in params.values():
            if type(value) is str and len(value) > LONGEST_PARAMETER:
                return None
        return read, tuple(params.items())

    def get(self, key: Hashable, token: Hashable | None, now: float = 0.0) -> tuple[bool, Any]:
        """(True, rows) when ``key``'s rows were kept under ``token`` and may still be used at ``now``, else
        (False, None)."""
        found = self._entries.get(key)
        if found is None or token is None or found[0] != token or now >= found[3]:
            return False, None
        return True, found[1]

    def put(self, key: Hashable, token: Hashable, rows: Any, until: float = math.inf) -> None:
        """Keep ``rows`` (a row, None, or a tuple of rows) of ``key`` under ``token``, to be used before ``until``
        (by the clock ``get`` is given)."""
        entries = self._entries
        weight = _weight(key) + _weight(rows)
        old = entries.pop(key, None)
        if old is not None:
            self._bytes -= old[2]
        entries[key] = (token, rows, weight, until)
        self._bytes += weight
        while self._bytes > self._max_bytes and entries:
            self._bytes -= entries.popitem(last=False)[1][2]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _weight(value: Any) -> int:
    """About what ``value`` (rows, a key: tuples of plain values) holds, in bytes."""
    if type(value) is tuple:
        return 64 + sum(_weight(item) for item in value)
    if type(value) is str:
        return 64 + len(value)
    return 64


class ReadCache:
    """Rows of org-scoped reads on PostgreSQL, valid while the generations they were read under hold."""

    def __init__(self, url: str, *, enabled: bool = True, keep_seconds: float = KEEP_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._url = url
        self._enabled = enabled  # off: it never listens, so nothing is kept (OPENRELAY_POLL_CACHE=0)
        self._keep_seconds = keep_seconds
        self._clock = clock
        self._name = secrets.token_hex(8)  # in its probes: its own are told from every other process's
        self._entries = KeptRows()
        self._orgs: dict[str, int] = {}
        self._generation = 0
        self.listening = False  # True only while notices are being received
        self._task: asyncio.Task[None] | None = None

    # -- reads (on the event loop) --------------------------------------------------------------------------------

    def token(self, org_id: str) -> Token | None:
        """The generations to read ``org_id``'s rows under, and the time; None while no notice can be received."""
        if not self.listening:
            return None
        return self._generation, self._orgs.get(org_id, 0), self._clock()

    def get(self, key: Hashable, org_id: str) -> tuple[bool, Any]:
        """(True, rows) when ``key``'s rows are kept, still current and younger than ``KEEP_SECONDS``, else
        (False, None)."""
        if not self.listening:
            return False, None
        return self._entries.get(key, (self._generation, self._orgs.get(org_id, 0)), self._clock())

    def put(self, key: Hashable, org_id: str, token: Token | None, rows: Any) -> None:
        """Keep ``rows``, read under ``token``, if nothing has changed since the token was taken: usable until
        ``KEEP_SECONDS`` after it was."""
        if token is not None and self.listening and token[:2] == (self._generation, self._orgs.get(org_id, 0)):
            self._entries.put(key, token[:2], rows, until=token[2] + self._keep_seconds)

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
            outcome = "down"  # or "heard" (listened a while), "deaf" (its probe never came back), "off"
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, application_name="openrelay-read-cache", connect_timeout=5,
                    keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=5)
                async with conn:
                    setting = await (await conn.execute(
                        "SELECT current_setting('openrelay.notices', true)")).fetchone() or (None,)
                    if setting[0] == "off":
                        outcome = "off"  # the database sends no change notices: nothing may be kept
                    else:
                        await conn.execute(f"LISTEN {CHANNEL}")
                        outcome = "heard" if await self._hear(conn) else "deaf"
            except psycopg.Error as exc:
                log.info("the read cache's listener is down (%s); polls read the server until it is back", exc)
            except Exception:  # a bug here must not end the listener for good; polls read the server meanwhile
                log.exception("the read cache's listener failed; polls read the server until it is back")
            finally:
                self.listening = False
                self._forget()
            if outcome == "off":
                log.info("the database's openrelay.notices is off: polls read the server")
            elif outcome == "deaf":
                log.warning("the read cache's listener did not hear its own notice within %.0f s; polls read the "
                            "server. Behind a pooler in transaction mode, set OPENRELAY_POLL_CACHE=0",
                            PROBE_SECONDS)
            attempt = 0 if outcome == "heard" else attempt + 1
            await asyncio.sleep(_RELISTEN.delay(attempt + 1))

    async def _hear(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Take notices on ``conn`` until it fails or stops hearing its own probes; whether it ever heard one.
        Each round sends a probe and takes notices for ``PROBE_SECONDS``; one that ends without its probe back
        ends the listening."""
        heard = False
        for n in itertools.count():  # ends by a return: when a probe does not come back
            probe = f"{_PROBE}{self._name}:{n}"
            try:  # on a connection gone silent, a statement waits for TCP to give up (minutes): not that long
                async with asyncio.timeout(PROBE_SECONDS):
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, probe))
            except TimeoutError:
                return heard
            back = False
            async for notice in conn.notifies(timeout=PROBE_SECONDS):
                payload = notice.payload
                if not payload.startswith(_PROBE):
                    self.changed(payload)
                elif payload == probe and not back:
                    back = True
                    if not heard:
                        # Every answer kept under an earlier listener may have missed a notice: start afresh.
                        heard = True
                        self._forget()
                        self.listening = True
            if not back:
                return heard
        raise AssertionError("itertools.count() ended")

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
