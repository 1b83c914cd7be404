"""Fixtures: a real test engine process, real `orl serve` processes, on SQLite or PostgreSQL.

The backend comes from ``OPENRELAY_TEST_DB`` (``sqlite``, the default, or ``postgres``); scripts/test.sh runs the
suite once on each. A test that cannot tell the two apart runs on SQLite only: the PostgreSQL pass deselects every
test that neither uses a server fixture (``server``, ``make_server``, ``module_server``) nor sits in a module that
picks its store from it (one that imports ``BACKEND``, ``Servers`` or ``fresh_database``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.polling import TERMINAL
from tests.support.server import Server, catalog_text, create_pg_database, drop_pg_database, free_port
from tests.support.test_engine import EngineControl as Engine
from tests.support.test_engine import start_test_engine, stop_test_engine
from tests.support.workers import WorkerProcess

BACKEND = os.environ.get("OPENRELAY_TEST_DB", "sqlite")

# The browser, context and page fixtures of the dashboard tests; the webhook tests' receiver, hook_server and org;
# the unit tier's OpenRelay in process (``relay``).
pytest_plugins = ["tests.support.browser", "tests.support.webhook_fixtures", "tests.support.relay"]


STORE_FIXTURES = frozenset({"server", "make_server", "module_server", "hook_server"})  # hook_server: webhooks
# A module holding one of these picks its store by OPENRELAY_TEST_DB (tests/support/store_rows.py: fresh_url...).
STORE_PICKERS = ("BACKEND", "Servers", "fresh_database", "fresh_url")


def pytest_report_header() -> str:
    return f"openrelay store backend: {BACKEND}"


def depends_on_the_store(item: pytest.Item) -> bool:
    """Whether the test's outcome can change with ``OPENRELAY_TEST_DB``."""
    if STORE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    module = getattr(item, "module", None)
    return module is None or any(hasattr(module, name) for name in STORE_PICKERS)


SLOW_FIXTURES = frozenset({"seaweed", "s3_bucket", "browser"})  # SeaweedFS, Chromium: a test using one is `slow`


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Hold every test that starts SeaweedFS or Chromium to the `slow` marker; on PostgreSQL, leave out the tests
    that run the same on either store: the SQLite pass runs them."""
    unmarked = [item.nodeid for item in items if SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError(f"these start SeaweedFS or Chromium but are not marked slow: {unmarked}")
    if BACKEND == "sqlite":
        return
    once = [item for item in items if not depends_on_the_store(item)]
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if depends_on_the_store(item)]


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    """Base URL (…/v1) of one test engine process for the whole session."""
    proc, url = start_test_engine()
    try:
        yield url
    finally:
        stop_test_engine(proc)


@pytest.fixture
def engine(engine_url: str) -> Iterator[Engine]:
    control = Engine(engine_url)
    control.reset()
    yield control
    control.reset()


class Servers:
    """Starts `orl serve` processes (each on a fresh SQLite file or PostgreSQL database) and stops them all."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.engine_url = engine_url
        self.started: list[Server] = []
        self.databases: list[str] = []

    def make(self, *, catalog: str | None = None, slots: int = 2, concurrency: int = 8,
             env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Server:
        data_dir: Path = self.tmp_path_factory.mktemp("orl")
        if BACKEND == "postgres":
            url = create_pg_database()
            self.databases.append(url)
        else:
            url = f"sqlite:///{data_dir / 'openrelay.db'}"
        extra = list(args)
        if catalog != "builtin":
            text = catalog or catalog_text(self.engine_url, slots=slots, concurrency=concurrency)
            catalog_path = data_dir / "catalog.toml"
            catalog_path.write_text(text)
            extra += ["--catalog", str(catalog_path)]
        server = Server(data_dir=data_dir, database_url=url, port=free_port(), args=extra,
                        env={"OPENRELAY_TICK_SECONDS": "0.05", "OPENRELAY_RETRY_BASE_SECONDS": "0.05",
                             "OPENRELAY_LEASE_SECONDS": "3", **(env or {})})
        self.started.append(server)
        return server.start()

    def stop_all(self) -> None:
        # Held requests are let go first: a server stopped with calls held at the engine would wait out its drain
        # (30 s) for them. The `engine` fixture's reset may have come first and held a running batch's next ones.
        Engine(self.engine_url).release()
        for server in self.started:
            server.stop()
        for url in self.databases:
            drop_pg_database(url)


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Callable[..., Server]]:
    """Start `orl serve` processes: ``make_server(catalog=None|"builtin"|text, slots=, concurrency=, env=, args=)``."""
    servers = Servers(tmp_path_factory, engine_url)
    yield servers.make
    servers.stop_all()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Server]:
    """One server on the test catalog for a whole module (see ``server``)."""
    servers = Servers(tmp_path_factory, engine_url)
    yield servers.make()
    servers.stop_all()


@pytest.fixture
def server(request: pytest.FixtureRequest, make_server: Callable[..., Server]) -> Iterator[Server]:
    """A server on the test catalog (model ``test/echo`` on the test engine, 2 slots, concurrency 8).

    A module that sets ``SERVER_PER_MODULE = True`` shares one server among its tests, each test seeing it as a
    fresh organization (``server.api_key``, ``server.org``): organizations see nothing of each other, which the
    API's own tests show. After each test its organizations' live batches are cancelled and held requests let
    go, so nothing of one test runs into the next. Tests that stop, restart or reconfigure the server, read its
    log, or count organizations keep a server of their own (``make_server``, or a module without the flag)."""
    if not getattr(request.module, "SERVER_PER_MODULE", False):
        yield make_server()
        return
    view = request.getfixturevalue("module_server").for_new_org()
    yield view
    end_live_batches(view, Engine(request.getfixturevalue("engine_url")))


@pytest.fixture
def start_worker() -> Iterator[Callable[..., WorkerProcess]]:
    """``start_worker(server, name=None, args=(), env=None)``: an `orl worker` on ``server``'s store, blobs,
    catalog and environment (``env`` over it), started (its claim loop running); each is killed after the test."""
    started: list[WorkerProcess] = []

    def start(server: Server, name: str | None = None, args: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess.beside(server, name or f"worker-{len(started)}", args, env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def end_live_batches(view: Server, engine: Engine, timeout: float = 60.0) -> None:
    """Cancel every batch the test's organizations left running, letting held requests go, until all have ended."""
    deadline = time.monotonic() + timeout
    while True:
        live = []
        for key in view.keys_made:
            page = view.http("GET", "/batches", api_key=key, params={"limit": 100})
            if page.status_code == 200:
                live += [(key, b) for b in page.json()["data"] if b["status"] not in TERMINAL]
        if not live:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"batches left running after the test would not end: {[b for _, b in live]}")
        for key, batch in live:
            if batch["status"] != "cancelling":
                view.http("POST", f"/batches/{batch['id']}/cancel", api_key=key)
        engine.release()
        time.sleep(0.05)
