"""The OpenAPI document (``openrelay/api/openapi.json``) against the app: the same routes both ways, served byte
for byte, and schemathesis against a live `orl serve`: no server error, and every answer's status code, content
type and body as the document says.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import checks as st_checks
from starlette.routing import Route

from openrelay.api.app import create_app
from openrelay.api.openapi import document_bytes
from openrelay.config import Settings
from openrelay.runtime import open_runtime
from tests.support.server import TEST_CATALOG, Server, create_pg_database, drop_pg_database, free_port

DOCUMENT_PATH = Path(__file__).resolve().parents[1] / "openrelay" / "api" / "openapi.json"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# Bounded so the run stays well under a minute per store backend; the seed makes it the same run every time.
MAX_EXAMPLES = 25
SEED = 20261201
CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance"]
BACKEND = os.environ.get("OPENRELAY_TEST_DB", "sqlite")


def _document() -> dict[str, Any]:
    return json.loads(DOCUMENT_PATH.read_bytes())


def _document_operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item
            if method in HTTP_METHODS}


def _app_operations(tmp_path: Path) -> set[tuple[str, str]]:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(TEST_CATALOG.format(engine="http://127.0.0.1:9/v1", slots=1, concurrency=1))
    rt = open_runtime(Settings.build(data_dir=tmp_path, database_url=None, catalog_path=catalog))
    try:
        app = create_app(rt)
    finally:
        rt.close()
    return {(method, route.path) for route in app.routes if isinstance(route, Route)
            for method in route.methods or () if method != "HEAD"}


def test_document_is_openapi_3_1_and_its_references_resolve() -> None:
    document = _document()
    assert document["openapi"].startswith("3.1.")
    text = DOCUMENT_PATH.read_text()
    for ref in {part.split('"')[0] for part in text.split('"$ref": "')[1:]}:
        node: Any = document
        for step in ref.removeprefix("#/").split("/"):
            node = node[step]
    assert document_bytes() == DOCUMENT_PATH.read_bytes()  # what the package ships is the file


def test_app_routes_and_document_agree(tmp_path: Path) -> None:
    in_app = _app_operations(tmp_path)
    in_document = _document_operations(_document())
    assert in_app - in_document == set(), "routes the document does not describe"
    assert in_document - in_app == set(), "operations the app does not serve"


def test_served_document_is_the_file(server: Server) -> None:
    answer = httpx.get(server.base_url.removesuffix("/v1") + "/openapi.json", timeout=30)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == DOCUMENT_PATH.read_bytes()


# -- schemathesis against a live server ---------------------------------------------------------------------------
# One server for every operation (the ``server`` fixture is per test, and schemathesis makes a test of each). The
# schema is loaded from the file at import: ``test_served_document_is_the_file`` holds it to what the server serves.
# (schemathesis.pytest.from_fixture, which would load it from the live server, needs pytest's Node._nodeid, gone in
# pytest 9.2.)

schema = schemathesis.openapi.from_path(DOCUMENT_PATH, config=schemathesis.Config.from_dict({
    "seed": SEED,
    "suppress-health-check": ["too_slow", "data_too_large", "filter_too_much", "large_base_example"],
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    "phases": {"stateful": {"enabled": False}},
}))
_tally: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str,
                pytestconfig: pytest.Config) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("orl-openapi")
    database_url = create_pg_database() if BACKEND == "postgres" else f"sqlite:///{data_dir / 'openrelay.db'}"
    catalog = data_dir / "catalog.toml"
    catalog.write_text(TEST_CATALOG.format(engine=engine_url, slots=2, concurrency=8))
    server = Server(data_dir=data_dir, database_url=database_url, port=free_port(),
                    args=["--catalog", str(catalog)], env={"OPENRELAY_TICK_SECONDS": "0.05"})
    try:
        yield server.start()
    finally:
        server.stop()
        if BACKEND == "postgres":
            drop_pg_database(database_url)
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and _tally:
            summary = ", ".join(f"{k}: {v}" for k, v in sorted(_tally.items()))
            reporter.write_line(f"\nschemathesis ran {sum(_tally.values())} cases ({summary})")


@schema.parametrize()
def test_live_server_answers_as_documented(case: schemathesis.Case, live_server: Server) -> None:
    response = case.call_and_validate(base_url=live_server.base_url.removesuffix("/v1"),
                                      headers={"Authorization": f"Bearer {live_server.api_key}"},
                                      checks=[getattr(st_checks, name) for name in CHECKS])
    _tally[f"{case.operation.label} {response.status_code}"] += 1
