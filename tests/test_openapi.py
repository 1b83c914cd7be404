"""The OpenAPI document (``openrelay/api/openapi.json``) against the app: the same routes both ways, served byte
for byte, and schemathesis against a live `orl serve`: no server error, and every answer's status code, content
type and body as the document says.
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import schemathesis
from schemathesis import checks as st_checks
from starlette.routing import Route

from openrelay.api.app import create_app
from openrelay.api.openapi import document_bytes
from openrelay.config import Settings
from openrelay.runtime import open_runtime
from tests.support import http_client
from tests.support.server import TEST_CATALOG, Server, create_pg_database, drop_pg_database, free_port

DOCUMENT_PATH = Path(__file__).resolve().parents[1] / "openrelay" / "api" / "openapi.json"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# Bounded so the run stays well under a minute per store backend; the seed makes it the same run every time.
MAX_EXAMPLES = 100
SEED = 20261201
CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance"]
BACKEND = os.environ.get("OPENRELAY_TEST_DB", "sqlite")
MAX_UPLOAD_BYTES = 100_000  # small, so that a 413 is cheap to reach

# The document's examples name the built-in catalog's chat model; the live server offers it on the test engine,
# so schemathesis's examples phase (and the cases it derives from them) get past the model check.
EXAMPLES_MODEL = """
[[models]]
name = "openrelay/smollm2-135m"
endpoints = ["/v1/chat/completions"]
slots = 2
concurrency = 8
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{engine}", served_model = "smollm2-served" }}
"""


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
    # The dashboard's HTML pages (openrelay/web) are routes with include_in_schema=False: not the API's surface.
    # A path parameter's convertor (``{model_id:path}``: ids hold slashes) is the app's business, not the document's.
    return {(method, re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)) for route in app.routes
            if isinstance(route, Route) and route.include_in_schema
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
    answer = http_client.get(server.base_url.removesuffix("/v1") + "/openapi.json", timeout=30)
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
    # Every generated case carries the live server's key (401s are driven below), so each reaches the handler.
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none",
                   "with-security-parameters": False},
    "phases": {"stateful": {"enabled": False}},
}))
_tally: collections.Counter[str] = collections.Counter()  # generated cases, by operation and status
_driven: collections.Counter[str] = collections.Counter()  # the requests of the tests below


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str,
                pytestconfig: pytest.Config) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("orl-openapi")
    database_url = create_pg_database() if BACKEND == "postgres" else f"sqlite:///{data_dir / 'openrelay.db'}"
    catalog = data_dir / "catalog.toml"
    catalog.write_text(TEST_CATALOG.format(engine=engine_url, slots=2, concurrency=8)
                       + EXAMPLES_MODEL.format(engine=engine_url))
    server = Server(data_dir=data_dir, database_url=database_url, port=free_port(),
                    args=["--catalog", str(catalog)],
                    env={"OPENRELAY_TICK_SECONDS": "0.05", "OPENRELAY_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES)})
    try:
        yield server.start()
    finally:
        server.stop()
        if BACKEND == "postgres":
            drop_pg_database(database_url)
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and _tally:
            summary = ", ".join(f"{k}: {v}" for k, v in sorted(_tally.items()))
            reporter.write_line(f"\nschemathesis generated {sum(_tally.values())} cases ({summary}); "
                                f"{sum(_driven.values())} more requests driven on purpose")


@pytest.mark.slow
@schema.parametrize()
def test_live_server_answers_as_documented(case: schemathesis.Case, live_server: Server) -> None:
    response = case.call_and_validate(base_url=live_server.base_url.removesuffix("/v1"),
                                      headers={"Authorization": f"Bearer {live_server.api_key}"},
                                      checks=[getattr(st_checks, name) for name in CHECKS])
    _tally[f"{case.operation.label} {response.status_code}"] += 1


# -- every operation's answers, driven on purpose ------------------------------------------------------------------
# Generated cases rarely reach a 200 of the id routes (a random id is a 404) or the states behind 402, 409 and 422;
# here each documented answer is reached by a request made for it, and checked against the document the same way.

def _call(live: Server, method: str, path: str, expect: int, *, key: str | None = None,
          **case: Any) -> schemathesis.Response:
    headers = {} if key == "" else {"Authorization": f"Bearer {key or live.api_key}"}
    response = schema[path][method].Case(**case).call_and_validate(
        base_url=live.base_url.removesuffix("/v1"), headers=headers,
        checks=[getattr(st_checks, name) for name in CHECKS])
    assert response.status_code == expect, f"{method} {path}: {response.status_code} {response.text[:500]}"
    _driven[f"{method} {path} {response.status_code}"] += 1
    return response


def _record(custom_id: str, model: str = "test/echo", text: str = "hello") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def _create(records: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": records, **fields}


def test_every_operation_answers_as_documented(live_server: Server, engine_url: str) -> None:
    live = live_server
    for path in ("/healthz", "/metrics", "/openapi.json"):
        _call(live, "GET", path, 200, key="")
    _call(live, "GET", "/v1/models", 200)
    _call(live, "GET", "/v1/models", 401, key="")
    _call(live, "GET", "/v1/models", 401, key="orl-not-a-key")

    # files
    jsonl = b"".join(json.dumps(_record(f"r{i}")).encode() + b"\n" for i in range(2)) + b"{broken\n"
    upload = {"media_type": "multipart/form-data"}
    file = _call(live, "POST", "/v1/files", 200, body={"file": jsonl, "purpose": "batch"}, **upload).json()
    _call(live, "POST", "/v1/files", 400, body={"file": jsonl, "purpose": "fine-tune"}, **upload)
    _call(live, "POST", "/v1/files", 413, body={"file": b"x" * (MAX_UPLOAD_BYTES + 1), "purpose": "batch"},
          **upload)
    read_only = live.new_org_key(None, "--scopes", "files.read,batch.read")
    _call(live, "POST", "/v1/files", 403, key=read_only, body={"file": jsonl, "purpose": "batch"}, **upload)
    assert _call(live, "GET", "/v1/files", 200, query={"limit": 1}).json()["data"][0]["id"] == file["id"]
    _call(live, "GET", "/v1/files", 400, query={"limit": 0})
    _call(live, "GET", "/v1/files", 404, query={"after": "file-000000000000000000000000"})
    _call(live, "GET", "/v1/files/{file_id}", 200, path_parameters={"file_id": file["id"]})
    assert _call(live, "GET", "/v1/files/{file_id}/content", 200,
                 path_parameters={"file_id": file["id"]}).content == jsonl
    _call(live, "GET", "/v1/files/{file_id}/content", 404, path_parameters={"file_id": "file-nope"})

    # batches: from the file, with a rejected record; replayed and refused under its Idempotency-Key
    from_file = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h",
                 "metadata": {"tags": "openapi,docs"}}
    idem = {"Idempotency-Key": f"openapi-{file['id']}"}
    created = _call(live, "POST", "/v1/batches", 200, body=from_file, headers=idem).json()
    assert created["rejected_count"] == 1 and created["rejected_records"][0]["code"] == "invalid_json"
    assert _call(live, "POST", "/v1/batches", 200, body=from_file, headers=idem).json()["id"] == created["id"]
    _call(live, "POST", "/v1/batches", 422, body={**from_file, "metadata": None}, headers=idem)
    _call(live, "POST", "/v1/batches", 404, body={**from_file, "input_file_id": "file-nope"})
    _call(live, "POST", "/v1/batches", 400, body=_create([_record("a", model="no/such-model")]))
    _call(live, "POST", "/v1/batches", 400, body=_create([_record("a")], completion_window="1h"))
    _call(live, "POST", "/v1/batches", 403, key=read_only, body=_create([_record("a")]))
    spent = live.new_org_key(None, "--budget-usd", "0")
    _call(live, "POST", "/v1/batches", 402, key=spent, body=_create([_record("a")]))
    org = f"no-expedited-{created['id']}"
    standard_only = live.new_org_key(org)
    assert live.admin("org", "set", org, "--expedited", "off").returncode == 0
    _call(live, "POST", "/v1/batches", 409, key=standard_only, body=_create([_record("a")], priority="expedited"))

    batch_path = {"path_parameters": {"batch_id": created["id"]}}
    _call(live, "GET", "/v1/batches/{batch_id}", 200, **batch_path)
    _call(live, "GET", "/v1/batches/{batch_id}", 404, path_parameters={"batch_id": "batch_000000000000"})
    listed = _call(live, "GET", "/v1/batches", 200, query={"limit": 5, "tag": "openapi", "model": "test/echo"})
    assert [b["id"] for b in listed.json()["data"]] == [created["id"]]
    _call(live, "GET", "/v1/batches", 400, query={"status": "running"})
    _call(live, "GET", "/v1/batches", 404, query={"after": "batch_000000000000"})
    _call(live, "POST", "/v1/batches/{batch_id}/metadata", 200, body={"metadata": {"job": "docs"}}, **batch_path)
    _call(live, "POST", "/v1/batches/{batch_id}/metadata", 400,
          body={"metadata": {f"k{i}": "v" for i in range(33)}}, **batch_path)
    _call(live, "POST", "/v1/batches/{batch_id}/metadata", 404, body={"metadata": {}},
          path_parameters={"batch_id": "batch_000000000000"})

    done = live.wait(created["id"])
    assert done["status"] == "completed" and done["output_file_id"]
    _call(live, "GET", "/v1/batches/{batch_id}", 200, **batch_path)
    _call(live, "GET", "/v1/files/{file_id}/content", 200, path_parameters={"file_id": done["output_file_id"]})
    _call(live, "POST", "/v1/batches/{batch_id}/cancel", 409, **batch_path)

    # a batch held at the engine is still running when it is cancelled
    gate = f"openapi-{created['id']}"
    held = _call(live, "POST", "/v1/batches", 200, body=_create([_record("h", text=f"#hold={gate}")])).json()
    cancelled = _call(live, "POST", "/v1/batches/{batch_id}/cancel", 200,
                      path_parameters={"batch_id": held["id"]}).json()
    assert cancelled["status"] in ("cancelling", "cancelled")
    http_client.post(engine_url.removesuffix("/v1") + "/control/release", json={"name": gate},
                     timeout=10).raise_for_status()
    assert live.wait(held["id"])["status"] == "cancelled"
    _call(live, "GET", "/v1/batches", 200, query={"status": "cancelled"})

    # Anthropic's message batches: its shapes and its error envelope
    message = {"requests": [{"custom_id": "m", "params": {"model": "test/echo", "max_tokens": 8,
                                                          "messages": [{"role": "user", "content": "hi"}]}}]}
    made = _call(live, "POST", "/v1/messages/batches", 200, body=message).json()
    _call(live, "POST", "/v1/messages/batches", 400, body={"requests": []})
    _call(live, "POST", "/v1/messages/batches", 401, key="orl-not-a-key", body=message)
    _call(live, "POST", "/v1/messages/batches", 402, key=spent, body=message)
    _call(live, "POST", "/v1/messages/batches", 403, key=read_only, body=message)
    _call(live, "GET", "/v1/messages/batches/{batch_id}", 404, path_parameters={"batch_id": created["id"]})
    live.wait(made["id"])
    message_path = {"path_parameters": {"batch_id": made["id"]}}
    _call(live, "GET", "/v1/messages/batches/{batch_id}", 200, **message_path)
    assert _call(live, "GET", "/v1/messages/batches", 200, query={"limit": 1}).json()["first_id"] == made["id"]
    _call(live, "GET", "/v1/messages/batches", 400, query={"limit": 0})
    _call(live, "GET", "/v1/messages/batches", 404, query={"after_id": "batch_000000000000"})
    assert b'"succeeded"' in _call(live, "GET", "/v1/messages/batches/{batch_id}/results", 200,
                                   **message_path).content
    _call(live, "POST", "/v1/messages/batches/{batch_id}/cancel", 409, **message_path)
    _call(live, "DELETE", "/v1/messages/batches/{batch_id}", 200, **message_path)
    _call(live, "DELETE", "/v1/messages/batches/{batch_id}", 404, **message_path)

    _call(live, "DELETE", "/v1/files/{file_id}", 200, path_parameters={"file_id": file["id"]})
    _call(live, "DELETE", "/v1/files/{file_id}", 404, path_parameters={"file_id": file["id"]})
    _call(live, "GET", "/v1/files/{file_id}", 404, path_parameters={"file_id": file["id"]})


def _schema_takes(pointer: str, instance: Any) -> bool:
    """Whether the document's schema at ``pointer`` (a JSON pointer into the document) accepts ``instance``."""
    return jsonschema.Draft202012Validator({**_document(), "$ref": pointer}).is_valid(instance)


_FORM = "#/paths/~1v1~1files/post/requestBody/content/multipart~1form-data/schema"
_JSONL = json.dumps(_record("a")).encode() + b"\n"


def test_the_document_refuses_what_the_server_refuses(live_server: Server) -> None:
    """Issue 34 part 6: for each request here, the document's schema and the server agree on whether it may be
    sent (the server refuses it with 400, or takes it: 200, or 404 for a retry of an unknown batch)."""
    live = live_server
    seconds, anchor = "expires_after[seconds]", "expires_after[anchor]"
    one_part = json.dumps({"anchor": "created_at", "seconds": 3600})
    uploads = [({seconds: "3600"}, False), ({anchor: "created_at"}, False), ({anchor: "created_at", seconds: "1"},
               False), ({anchor: "created_at", seconds: "0003600"}, True), ({"note": "x"}, True),
               ({"expires_after": one_part}, True),
               ({"expires_after": json.dumps({"anchor": "created_at", "seconds": 60})}, False)]
    for fields, takes in uploads:
        answer = live.http("POST", "/files", files={"file": ("in.jsonl", _JSONL)}, data={"purpose": "batch", **fields})
        assert answer.status_code == (200 if takes else 400), (fields, answer.text)
        parts = {k: json.loads(v) if k == "expires_after" else v for k, v in fields.items()}
        assert _schema_takes(_FORM, {"file": "x", "purpose": "batch", **parts}) is takes, fields
    creates = [({"output_expires_after": None}, True),
               ({"output_expires_after": {"anchor": "created_at", "seconds": 60}}, False)]
    for fields, takes in creates:
        body = _create([_record("a")], **fields)
        assert live.http("POST", "/batches", json=body).status_code == (200 if takes else 400), fields
        assert _schema_takes("#/components/schemas/BatchCreateRequest", body) is takes, fields
    for body, takes in (({"codes": None}, True), ({"codes": []}, False), ({"codes": [""]}, False)):
        answer = live.http("POST", "/batches/batch_000000000000/retry", json=body)
        assert answer.status_code == (404 if takes else 400), (body, answer.text)
        assert _schema_takes("#/components/schemas/RetryRequest", body) is takes, body
    hooks = [({"url": "https://hooks.example.com/x"}, True), ({"url": "ftp://hooks.example.com/x"}, False),
             ({"url": "https://hooks.example.com/x", "secret": "mine"}, False)]
    for body, takes in hooks:
        assert live.http("POST", "/webhooks", json=body).status_code == (200 if takes else 400), body
        assert _schema_takes("#/components/schemas/WebhookCreateRequest", body) is takes, body


NUL_CASES = [
    ("GET", "/v1/batches/{batch_id}", 404, {"path_parameters": {"batch_id": "batch_\x00"}}),
    ("POST", "/v1/batches/{batch_id}/cancel", 404, {"path_parameters": {"batch_id": "batch_\x00"}}),
    ("POST", "/v1/batches/{batch_id}/metadata", 404, {"path_parameters": {"batch_id": "batch_\x00"},
                                                       "body": {"metadata": {}}}),
    ("GET", "/v1/batches", 404, {"query": {"after": "batch_\x00"}}),
    ("GET", "/v1/batches", 200, {"query": {"model": "test/\x00"}}),
    ("GET", "/v1/batches", 200, {"query": {"tag": "\x00"}}),
    ("GET", "/v1/files/{file_id}", 404, {"path_parameters": {"file_id": "file-\x00"}}),
    ("GET", "/v1/files/{file_id}/content", 404, {"path_parameters": {"file_id": "file-\x00"}}),
    ("DELETE", "/v1/files/{file_id}", 404, {"path_parameters": {"file_id": "file-\x00"}}),
    ("GET", "/v1/files", 404, {"query": {"after": "file-\x00"}}),
    ("GET", "/v1/files", 200, {"query": {"purpose": "\x00"}}),
    ("POST", "/v1/batches", 404, {"body": {"input_file_id": "file-\x00", "endpoint": "/v1/chat/completions",
                                           "completion_window": "24h"}}),
    ("GET", "/v1/messages/batches/{batch_id}", 404, {"path_parameters": {"batch_id": "batch_\x00"}}),
    ("DELETE", "/v1/messages/batches/{batch_id}", 404, {"path_parameters": {"batch_id": "batch_\x00"}}),
    ("GET", "/v1/messages/batches", 404, {"query": {"before_id": "batch_\x00"}}),
]
def _nul_case_id(method: str, path: str, case: dict[str, Any]) -> str:
    where = case.get("query") or case.get("path_parameters") or case.get("body") or {}
    return f"{method} {path} {','.join(where)}"


@pytest.mark.parametrize(("method", "path", "expect", "case"), [
    pytest.param(*c, id=_nul_case_id(c[0], c[1], c[3])) for c in NUL_CASES
])
def test_a_nul_character_in_an_id_or_filter_is_an_ordinary_miss(live_server: Server, method: str, path: str,
                                                                 expect: int, case: dict[str, Any]) -> None:
    """No object has such an id and no filter such a value (PostgreSQL's text cannot even hold the character)."""
    _call(live_server, method, path, expect, **case)
