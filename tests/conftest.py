"""Fixtures: a real test engine process, real `orl serve` processes, on SQLite or PostgreSQL.

The backend comes from ``OPENRELAY_TEST_DB`` (``sqlite``, the default, or ``postgres``); `.ci/run` runs the
whole suite once on each.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.server import TEST_CATALOG, Server, create_pg_database, drop_pg_database, free_port
from tests.support.test_engine import EngineControl as Engine
from tests.support.test_engine import start_test_engine, stop_test_engine

BACKEND = os.environ.get("OPENRELAY_TEST_DB", "sqlite")


def pytest_report_header() -> str:
    return f"openrelay store backend: {BACKEND}"


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


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Callable[..., Server]]:
    """Start `orl serve` processes: ``make_server(catalog=None|"builtin"|text, slots=, concurrency=, env=, args=)``."""
    started: list[Server] = []
    databases: list[str] = []

    def make(*, catalog: str | None = None, slots: int = 2, concurrency: int = 8,
             env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Server:
        data_dir: Path = tmp_path_factory.mktemp("orl")
        if BACKEND == "postgres":
            url = create_pg_database()
            databases.append(url)
        else:
            url = f"sqlite:///{data_dir / 'openrelay.db'}"
        extra = list(args)
        if catalog != "builtin":
            text = catalog or TEST_CATALOG.format(engine=engine_url, slots=slots, concurrency=concurrency)
            catalog_path = data_dir / "catalog.toml"
            catalog_path.write_text(text)
            extra += ["--catalog", str(catalog_path)]
        server = Server(data_dir=data_dir, database_url=url, port=free_port(), args=extra,
                        env={"OPENRELAY_TICK_SECONDS": "0.05", "OPENRELAY_RETRY_BASE_SECONDS": "0.05",
                             "OPENRELAY_LEASE_SECONDS": "3", **(env or {})})
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()
    for url in databases:
        drop_pg_database(url)


@pytest.fixture
def server(make_server: Callable[..., Server]) -> Server:
    """A server on the test catalog (model ``test/echo`` on the test engine, 2 slots, concurrency 8)."""
    return make_server()
