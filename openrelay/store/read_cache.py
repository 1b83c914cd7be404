"""Poll answers kept in memory while PostgreSQL says nothing they read has changed: a trigger NOTIFYs each
organization's writes, one LISTEN per process bumps its generation, and a write of this process forgets its
organization's reads at once (``http/writes.OrgWrites``, told by ``api/context.py``). Bounded to 16 MiB of rows.
How it stays correct across processes and outages: docs/design.md, "The poll read cache"."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

import psycopg
from sqlalchemy.engine import Connection

from ..backoff import Backoff
from ..metrics import POLL_READS

__all__ = ["KeptRows", "ReadCache", "CHANNEL", "Token", "POLL_KEPT", "POLL_SERVER", "create_change_trigger"]

log = logging.getLogger("openrelay.store")

CHANNEL = "openrelay_batches"
PROBE_SECONDS = 5.0  # a listener whose own notice has not come back within this long is taken as down
_PROBE = " probe "  # starts a probe's payload; no organization id holds a space
_RELISTEN = Backoff(base=0.1, cap=30.0)  # the wait before listening again: 0.1 s after a listen that heard, doubling
_MOST_ORGS = 100_000
LONGEST_PARAMETER = 600  # characters: an id, a tag (at most 512), a model name; a longer one is kept by no read
POLL_KEPT, POLL_SERVER = POLL_READS.labels("kept"), POLL_READS.labels("server")

# The generations a read was made under: the listener's (bumped each time it starts afresh) and its
# organization's (bumped by notices and by this process's own writes). Everything here runs on the event loop.
Token = tuple[int, int]


class KeptRows:
    """Rows of reads by (read, parameters), each with the token it was read under, weighing at most ``max_bytes``
    in all (each entry its values' lengths, and 64 per value and row besides), the least recently kept dropped
    first. Used on the event loop only."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[Hashable, tuple[Hashable, Any, int]] = OrderedDict()

    @staticmethod
    def key(read: Any, params: Mapping[str, Any]) -> Hashable | None:
        """The entry of ``read`` with ``params``, or None when a parameter is too long to be worth keeping."""
        for value in params.values():
            if type(value) is str and len(value) > LONGEST_PARAMETER:
                return None
        return read, tuple(params.items())

    def get(self, key: Hashable, token: Hashable | None) -> tuple[bool, Any]:
        """(True, rows) when ``key``'s rows were kept under ``token``, else (False, None)."""
        found = self._entries.get(key)
        if found is None or token is None or found[0] != token:
            return False, None
        return True, found[1]

    def put(self, key: Hashable, token: Hashable, rows: Any) -> None:
        """Keep ``rows`` (a row, None, or a tuple of rows) of ``key`` under ``token``."""
        entries = self._entries
        weight = _weight(key) + _weight(rows)
        old = entries.pop(key, None)
        if old is not None:
            self._bytes -= old[2]
        entries[key] = (token, rows, weight)
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

    def __init__(self, url: str, *, enabled: bool = True) -> None:
        self._url = url
        self._enabled = enabled  # off: it never listens, so nothing is kept (OPENRELAY_POLL_CACHE=0)
        self._name = secrets.token_hex(8)  # in its probes: its own are told from every other process's
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
            outcome = "down"  # or "heard" (listened a while), "deaf" (its probe never came back), "off"
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, application_name="openrelay-read-cache", connect_timeout=5,
                    keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=5)
                async with conn:
                    setting = await (await conn.execute("SELECT current_setting('openrelay.notices', true)")
                                     ).fetchone()
                    if setting is not None and setting[0] == "off":
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


def create_change_trigger(conn: Connection) -> None:
    """On PostgreSQL, every insert, update and delete of ``batches`` and ``batch_tags`` notifies channel
    ``CHANNEL`` with the row's organization, at commit, for the listeners above; but for an update of a
    batch that changes only its lease (a worker's heartbeat, every tick of every running batch), which no poll's
    answer shows. ``ALTER DATABASE ... SET openrelay.notices = 'off'`` stops them (each commit that notifies
    takes PostgreSQL's notify lock: docs/deploy.md has what that costs); the API's listeners then keep nothing.
    SQLite has no notices: its polls check the file's ``data_version`` instead."""
    if conn.dialect.name != "postgresql":
        return
    conn.exec_driver_sql(
        "CREATE OR REPLACE FUNCTION openrelay_announce_batch_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN "
        "IF current_setting('openrelay.notices', true) = 'off' THEN RETURN NULL; END IF; "
        f"IF TG_OP = 'DELETE' THEN PERFORM pg_notify('{CHANNEL}', OLD.org_id); "
        f"ELSE PERFORM pg_notify('{CHANNEL}', NEW.org_id); END IF; "
        "IF TG_OP = 'UPDATE' AND OLD.org_id IS DISTINCT FROM NEW.org_id THEN "
        f"PERFORM pg_notify('{CHANNEL}', OLD.org_id); END IF; "
        "RETURN NULL; END $$")
    run = "EXECUTE FUNCTION openrelay_announce_batch_change()"
    unleased = "(to_jsonb({}) - 'lease_owner' - 'lease_expires_at')"
    for statement in (
            f"CREATE TRIGGER batches_announce AFTER INSERT OR DELETE ON batches FOR EACH ROW {run}",
            f"CREATE TRIGGER batches_announce_update AFTER UPDATE ON batches FOR EACH ROW "
            f"WHEN ({unleased.format('OLD')} IS DISTINCT FROM {unleased.format('NEW')}) {run}",
            f"CREATE TRIGGER batch_tags_announce AFTER INSERT OR UPDATE OR DELETE ON batch_tags FOR EACH ROW {run}"):
        conn.exec_driver_sql(statement)
