"""PostgreSQL's change notices, which the API's read cache listens to (``store/read_cache.py``), sent by the
process that wrote, after its commit: a write transaction names what it changed (``announce``: an organization, or
a batch whose organization the notice looks up), ``Database.write`` hands that to its process's ``Notifier`` once
the transaction has committed, and the notifier sends ``NOTIFY openrelay_batches, '<org_id>'`` on a connection of
its own, at most once per organization (or batch) per ``openrelay.notice_seconds``, the changes in between sent
together at the end of that spacing. A commit takes no lock of PostgreSQL's for it. Why, and what bounds what a
poll may miss when a notice never comes: docs/design.md, "The poll read cache"."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from sqlalchemy.engine import Connection

from ..backoff import Backoff

__all__ = ["CHANNEL", "SPACING_SETTING", "DEFAULT_SPACING_SECONDS", "Notifier", "announce", "collect_announced",
           "stop_collecting"]

log = logging.getLogger("openrelay.store")

CHANNEL = "openrelay_batches"

# A database setting (``ALTER DATABASE ... SET openrelay.notice_seconds = '0.1'``), read by each notifier when it
# connects: an organization's (a batch's) changes within this long of its last notice wait for the end of it, then
# go in one notice. 0: every change is sent as soon as the notifier can.
SPACING_SETTING = "openrelay.notice_seconds"
DEFAULT_SPACING_SECONDS = 0.1
_GAP = 0.01  # between two sends of one notifier: at most 100 of its transactions a second take the notify lock
_RESEND = Backoff(base=0.1, cap=5.0)  # the wait after a send that failed (the database away), doubling
_PENDING = "openrelay_announced"  # in a write connection's ``info``: what its transaction announced
_ORG, _BATCH = "org", "batch"
_MOST_BATCHES = 100_000  # batches whose organization a notifier remembers; past it, it starts afresh

Changed = tuple[str, str]  # (_ORG, an organization's id) or (_BATCH, a batch's id)


def announce(conn: Connection, *, org_id: str | None = None, batch_id: str | None = None) -> None:
    """This write transaction changes what polls of ``org_id`` (or of ``batch_id``'s organization) show: notify
    them once it has committed. Every write of ``batches`` or ``batch_tags`` that a poll's answer can show calls
    this; a lease's renewal does not. A no-op outside ``Database.write`` on PostgreSQL (SQLite's readers see each
    commit by themselves)."""
    pending: set[Changed] | None = conn.info.get(_PENDING)
    if pending is not None:
        if org_id is not None:
            pending.add((_ORG, org_id))
        if batch_id is not None:
            pending.add((_BATCH, batch_id))


def collect_announced(conn: Connection) -> set[Changed]:
    """Start collecting what ``conn``'s transaction announces; the set is filled as it runs. ``Database.write``
    hands it to the notifier after the commit, and takes it off ``conn`` (``stop_collecting``) either way."""
    pending: set[Changed] = set()
    conn.info[_PENDING] = pending
    return pending


def stop_collecting(conn: Connection) -> None:
    conn.info.pop(_PENDING, None)


class Notifier:
    """One per process (per ``Database`` on PostgreSQL): what the process committed, sent as change notices on a
    connection of its own, by a thread started at the first change. Coalesced: an organization already waiting is
    not queued twice, and one sent less than the spacing ago waits until the spacing has passed; each send is one
    transaction carrying every organization due. A batch counts as its organization once a send has looked that up.
    ``close`` (and the interpreter's exit) sends what is still waiting."""

    def __init__(self, url: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._url = url
        self._clock = clock
        self._lock = threading.Condition()
        self._due: dict[Changed, float] = {}  # waiting: when each may be sent
        self._sent: dict[Changed, float] = {}  # when each was last sent (its spacing runs from there)
        self._org_of: dict[str, str] = {}  # batch id -> its organization, as sends found them (it never changes)
        self._spacing = DEFAULT_SPACING_SECONDS
        self._off = False  # the database's openrelay.notices is 'off': send nothing
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    def changed(self, names: Iterable[Changed]) -> None:
        """What a transaction that has committed announced (``announce``)."""
        with self._lock:
            if self._closing:
                return
            now, added = self._clock(), False
            for name in names:
                if name[0] == _BATCH and name[1] in self._org_of:
                    name = (_ORG, self._org_of[name[1]])
                if name not in self._due:
                    self._due[name] = max(now, self._sent.get(name, now) + self._spacing)
                    added = True
            if self._thread is None and self._due:
                self._thread = threading.Thread(target=self._run, name="openrelay-notices", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            elif added:
                self._lock.notify()  # it may be waiting for nothing, or for a later name

    def close(self, timeout: float = 5.0) -> None:
        """Send what is waiting now (each try once), then stop; a later change starts afresh."""
        with self._lock:
            self._closing = True
            self._lock.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            atexit.unregister(self.close)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._closing, self._thread = False, None

    def _run(self) -> None:
        failures = 0
        while True:
            with self._lock:
                due = self._take_due()
                if due is None:
                    break
            try:
                self._send(due)
                failures = 0
                wait = _GAP
            except Exception as exc:  # the database away (psycopg.Error), or a bug: neither may end the thread
                self._drop_connection()
                failures += 1
                wait = _RESEND.delay(failures)
                log.log(logging.INFO if isinstance(exc, psycopg.Error) else logging.ERROR,
                        "change notices could not be sent (%s); trying again in %.1f s", exc, wait)
                with self._lock:
                    if self._closing:
                        break  # polls elsewhere see these changes once their kept rows age out (read_cache)
                    for name in due:
                        self._due.setdefault(name, self._clock())
            self._pause(wait)
        self._drop_connection()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (new changes do not cut it short: they wait for the next send), or until closing."""
        deadline = self._clock() + seconds
        with self._lock:
            while not self._closing and (left := deadline - self._clock()) > 0:
                self._lock.wait(left)

    def _take_due(self) -> list[Changed] | None:
        """Under the lock: wait until some names are due (all of them when closing), take them and stamp them
        sent; None when closing with nothing left."""
        while True:
            now = self._clock()
            if self._closing:
                due = list(self._due)
                if not due:
                    return None
                break
            soonest = min(self._due.values(), default=None)
            if soonest is not None and soonest <= now:
                due = [name for name, at in self._due.items() if at <= now]
                break
            self._lock.wait(None if soonest is None else soonest - now)
        for name in due:
            del self._due[name]
            self._sent[name] = now
        if len(self._sent) > 1024:  # forget the spacings that have passed
            self._sent = {name: at for name, at in self._sent.items() if at + self._spacing > now}
        return due

    def _send(self, due: list[Changed]) -> None:
        conn = self._connection()
        if self._off:
            return
        orgs = {value for kind, value in due if kind == _ORG}
        batch_ids = [value for kind, value in due if kind == _BATCH]
        if batch_ids:  # read here, after the commit, rather than in the writer's transaction
            found = dict(conn.execute("SELECT id, org_id FROM batches WHERE id = ANY(%s)", (batch_ids,)).fetchall())
            orgs.update(found.values())
            with self._lock:
                if len(self._org_of) + len(found) > _MOST_BATCHES:
                    self._org_of.clear()
                self._org_of.update(found)
                sent = self._clock()
                for org_id in found.values():
                    self._sent[(_ORG, org_id)] = sent
        # One transaction, so one turn at the notify lock, for every organization due.
        conn.execute("SELECT pg_notify(%s, org_id) FROM unnest(%s::text[]) AS org_id", (CHANNEL, sorted(orgs)))

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self._url, autocommit=True, application_name="openrelay-notices",
                                   connect_timeout=5, keepalives=1, keepalives_idle=5, keepalives_interval=2,
                                   keepalives_count=5)
            setting, spacing = conn.execute("SELECT current_setting('openrelay.notices', true), "
                                            "current_setting(%s, true)", (SPACING_SETTING,)).fetchone() or (None, None)
            self._off = setting == "off"
            self._spacing = DEFAULT_SPACING_SECONDS if not spacing else float(spacing)
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
