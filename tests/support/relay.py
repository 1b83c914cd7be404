"""OpenRelay in the test's own process, for the unit tier: the real runtime (``open_runtime``: a SQLite file and
local blobs in a temp dir, the catalog), the real API app called through Starlette's ``TestClient``, and real
workers driven in burst mode (``Worker.run_forever(burst=True)``: claim and run until nothing is left, then
return), with the engines replaced at their boundary by ``MockEngine`` doubles (tests/support/mock_engine.py).
Nothing waits on the clock: a test creates batches, runs the workers until they are idle, and reads what the API
says. A ``Relay`` answers ``http`` as a ``Server`` does, so the helpers of tests/support/batches.py take either.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from openrelay.api.app import create_app
from openrelay.catalog import ModelSpec
from openrelay.config import Settings
from openrelay.engines.base import Engine
from openrelay.engines.factory import base_urls
from openrelay.runtime import Runtime, open_runtime
from openrelay.store.db import Database
from openrelay.worker.worker import Worker
from tests.support.mock_engine import EngineRequest, Handler, MockEngine, echo
from tests.support.server import catalog_text

__all__ = ["Relay", "relay", "ENGINE_URL", "FAST"]

ENGINE_URL = "http://engine.test/v1"  # the test catalog's engine: never reached, its replicas are MockEngines

# Every wait of a worker shortened: ticks, flushes, the gate's retries and probes, a failed run's retry
# (``config.py``'s variables).
FAST = {"OPENRELAY_TICK_SECONDS": "0.01", "OPENRELAY_FLUSH_SECONDS": "0.01", "OPENRELAY_RETRY_BASE_SECONDS": "0.001",
        "OPENRELAY_RETRY_MAX_SECONDS": "0.004", "OPENRELAY_OUTAGE_BASE_SECONDS": "0.005",
        "OPENRELAY_OUTAGE_MAX_SECONDS": "0.02", "OPENRELAY_ACCESS_LOG": "0",
        # Every poll reads the store: a test reads what a worker wrote a moment before, sooner than 0.25 s.
        "OPENRELAY_POLL_CACHE_SECONDS": "0",
        # A failed run is tried again no sooner than its task has ended: a retry due at once could be claimed by the
        # same worker before the failed run's task is done, which then forgets the new one (Worker._done).
        "OPENRELAY_RUN_RETRY_BASE_SECONDS": "0.2", "OPENRELAY_RUN_RETRY_MAX_SECONDS": "0.2"}
BURST_TIMEOUT = 60.0  # guards against a hang only: a burst on these settings takes milliseconds


@functools.cache
def _migrated_store(folder: Path) -> Path:
    """A SQLite file with every migration applied, made once in ``folder`` (the session's temp dir, beside the
    tests' own): each relay starts from a copy of it (a tenth of migrating anew). tests/unit/test_migrations.py shows
    the migrations themselves."""
    folder.mkdir(exist_ok=True)
    path = folder / "openrelay.db"
    db = Database(f"sqlite:///{path}")
    db.migrate()
    db.dispose()  # the last connection's close checkpoints the WAL into the file
    return path


class _Log(logging.Handler):
    """What OpenRelay logs (INFO and up), as ``Server.log`` has it from the process's stderr."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class Relay:
    """One OpenRelay, in process, on the test catalog (``test/echo``: 2 slots, concurrency 8) unless ``catalog``
    says otherwise. ``handler`` answers for every engine replica but those a test gave their own
    (``engine(url).handler``); ``env``: settings as the environment gives them (over ``FAST``); ``window_seconds``:
    the completion window (`--window-seconds`)."""

    def __init__(self, root: Path, *, catalog: str | None = None, handler: Handler = echo,
                 env: dict[str, str] | None = None, window_seconds: int | None = None) -> None:
        self.root = root
        self.handler = handler
        self.engines: dict[str, MockEngine] = {}  # by replica name (its URL): kept across bursts
        self.catalog_path = root / "catalog.toml"
        self.catalog_path.write_text(catalog or catalog_text(ENGINE_URL))
        (root / "data").mkdir()
        shutil.copyfile(_migrated_store(root.parent / "migrated-store"), root / "data" / "openrelay.db")
        self.settings = Settings.build(data_dir=root / "data", database_url=None, catalog_path=self.catalog_path,
                                       window_seconds=window_seconds, environ={**FAST, **(env or {})})
        self._log = _Log()
        self._logger = logging.getLogger("openrelay")
        self._level = self._logger.level
        self._logger.addHandler(self._log)
        self._logger.setLevel(logging.INFO)
        self.rt = open_runtime(self.settings)
        self.worker: Worker | None = None  # the first worker of the burst now running
        self._orgs = itertools.count(1)
        self.org, self.api_key = self.new_org()
        self._client = TestClient(create_app(self.rt), base_url="http://relay.test/v1")
        self._client.__enter__()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.__exit__(None, None, None)
        self.rt.close()
        self._logger.removeHandler(self._log)
        self._logger.setLevel(self._level)

    def log(self) -> str:
        return "\n".join(self._log.messages)

    def new_org(self, **key_options: Any) -> tuple[str, str]:
        """(name, the secret of a key with every scope unless ``key_options`` say otherwise) of a new organization."""
        org = self.rt.accounts.create_org(f"org-{next(self._orgs)}")
        _key, secret = self.rt.accounts.create_key(org.id, **key_options)
        return org.name, secret

    def http(self, method: str, path: str, api_key: str | None = None, **kwargs: Any) -> httpx.Response:
        """A request to the API (``path`` under /v1), with ``api_key`` (this relay's first; "" sends none)."""
        headers = kwargs.pop("headers", {})
        if api_key != "":
            headers.setdefault("authorization", f"Bearer {api_key or self.api_key}")
        return self._client.request(method, path, headers=headers, **kwargs)

    # -- the workers --------------------------------------------------------------------------------------------

    def engine(self, url: str = ENGINE_URL) -> MockEngine:
        """The double answering at ``url`` (one per replica, kept across bursts)."""
        name = url.rstrip("/")
        if name not in self.engines:
            self.engines[name] = MockEngine(self._answer, name=name)
        return self.engines[name]

    def _answer(self, request: EngineRequest) -> Any:
        return self.handler(request)

    def requests(self, url: str = ENGINE_URL) -> list[EngineRequest]:
        return self.engine(url).requests

    def build_engines(self, spec: ModelSpec) -> list[tuple[str, Engine]]:
        """What the worker is given instead of the catalog's engines: a replica per ``base_urls`` entry, each its
        ``MockEngine``."""
        return [(str(url).rstrip("/"), self.engine(str(url))) for url in base_urls(spec.engine)]

    def run_until_idle(self, *, workers: int = 1) -> None:
        """Start ``workers`` fresh workers (as processes would be) and let them claim and run until none has
        anything left to take; then they stop, as a stopped process's would."""
        asyncio.run(asyncio.wait_for(self._burst(workers), BURST_TIMEOUT))

    async def _burst(self, count: int, rt: Runtime | None = None) -> None:
        started = [Worker(rt or self.rt, build_engines=self.build_engines) for _ in range(count)]
        self.worker = started[0]
        try:
            await asyncio.gather(*(worker.run_forever(burst=True) for worker in started))
        finally:
            self.worker = None
            for worker in started:
                await worker.stop()

    def run_with_catalog(self, catalog: str) -> None:
        """``run_until_idle`` in a worker restarted on another catalog (on this relay's store and blobs)."""
        self.catalog_path.write_text(catalog)
        rt = open_runtime(self.settings)
        try:
            asyncio.run(asyncio.wait_for(self._burst(1, rt), BURST_TIMEOUT))
        finally:
            rt.close()


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    """An OpenRelay in process on a fresh SQLite file, every engine answering ``echo``."""
    with Relay(tmp_path) as made:
        yield made
