"""Fuzzed input never gets a 5xx or a dropped connection (issue 10, part 2), over real HTTP to `orl serve`.

Hypothesis generates uploaded files (JSONL with odd records: out-of-range numbers, deep nesting, a byte order
mark, invalid UTF-8, blank lines), creates from files and inline, metadata updates, and the query parameters
and ids of the read routes. Every answer must be below 500, a 4xx must be JSON in the OpenAI error envelope,
and one keep-alive connection (one ``httpx.Client``, one socket) must carry the whole run.

The suite's run is bounded (``OPENRELAY_FUZZ_EXAMPLES`` examples per test, 200 by default) and derandomized,
so CI is stable and fast; ``scripts/fuzz_api.py`` runs the same tests for longer with fresh random cases.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.batches import CHAT, EMBEDDINGS, ENVELOPE_KEYS

EXAMPLES = int(os.environ.get("OPENRELAY_FUZZ_EXAMPLES", "200"))
RANDOM = os.environ.get("OPENRELAY_FUZZ_RANDOM") == "1"  # the long run's fresh cases; the suite's are fixed
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])
TALLY: Counter[str] = Counter()  # requests by route and status, printed at the end of a run
# Hypothesis warns when a failing case's repr is large; a deep-nesting case is large by design.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")]


# -- JSON text with the shapes parsers trip on -------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A token written into the JSON text as it is (``1e400`` cannot be produced by any serializer)."""

    text: bytes


def dumps(value: Any) -> bytes:
    """JSON text of ``value``, where ``Raw`` leaves are written verbatim."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return b"{" + b",".join(orjson.dumps(str(k)) + b":" + dumps(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(dumps(v) for v in value) + b"]"
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value).encode()  # orjson refuses ints past 64 bits; JSON does not
    return orjson.dumps(value)


def _deep(depth: int, leaf: bytes = b'"x"') -> Raw:
    return Raw(b"[" * depth + leaf + b"]" * depth)


ODD_TOKENS = st.sampled_from([
    Raw(b"1e400"), Raw(b"-1e400"), Raw(b"1e309"), Raw(b"1.5E+999"), Raw(b"1e-400"), Raw(b"-0"), Raw(b"0.0e0"),
    Raw(b"1" + b"0" * 400), Raw(b"1" + b"0" * 400 + b".5"), Raw(b"123456789012345678901234567890"),
    Raw(b'"\\u0000"'), Raw(b'"\xff\xfe"'), Raw(b'"\xed\xa0\x80"'), _deep(64), _deep(255), _deep(300),
    Raw(b"{" + b'"a":{' * 300 + b"}" * 301),
])
# In a file each of these breaks only its own line; in a create's body, the whole body (a JSON parser cannot
# read past it): not JSON at all, a lone UTF-16 surrogate, nesting past what the parsers take.
BROKEN_TOKENS = st.sampled_from([Raw(b"NaN"), Raw(b"Infinity"), Raw(b"tru"), Raw(b"{"), Raw(b"]"),
                                 Raw(b'"unterminated'), Raw(b'"tab\tin string"'), Raw(b"01"), Raw(b'"\\ud800"'),
                                 Raw(b'"\\udc00\\ud800"'), _deep(1000), _deep(1025), _deep(3000)])
TEXT = st.text(max_size=30) | st.sampled_from(["", "\x00", "\u2028", "\ufeff", "é" * 70, "x" * 600, "%00", "../"])
NUMBERS = st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**40), 10**40)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT | ODD_TOKENS
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)

# Mostly the offered model, so that many records pass and the accepting paths (storing, answering) are fuzzed too.
MODELS = st.sampled_from(["test/echo"] * 6 + ["test/embed", "openrelay/unknown", ""]) | JSON
CUSTOM_IDS = st.sampled_from(["a", "b"]) | st.uuids().map(str) | st.uuids().map(str) | JSON
ENDPOINTS = st.sampled_from([CHAT, EMBEDDINGS, "/v1/completions", "/v1/responses", "", "/v1/chat/completions/"])


@st.composite
def records(draw: st.DrawFn) -> bytes:
    """One record's bytes: a good chat record with some of its parts replaced, removed or added to."""
    body: dict[str, Any] = {"model": draw(MODELS), "messages": [{"role": "user", "content": draw(TEXT)}]}
    record: dict[str, Any] = {"custom_id": draw(CUSTOM_IDS), "method": "POST",
                              "url": CHAT, "body": body}
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        where = draw(st.sampled_from(["record", "body"]))
        target = record if where == "record" else body
        key = draw(st.sampled_from(["custom_id", "method", "url", "body", "model", "stream", "openrelay",
                                    "tool_config", "max_tokens", "messages", "extra"]) | TEXT)
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(JSON | st.just({"tool_config": {"servers": [{"url": draw(TEXT)}]}})
                               | st.just({"workflow": {}}))
    return dumps(record if draw(st.integers(0, 9)) else draw(JSON))


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A line of a file: mostly a record, sometimes bytes that are no JSON at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=40) | st.sampled_from([b"[]", b"null", b'"x"', b"{}", b"\xef\xbb\xbf{}"])
                    | BROKEN_TOKENS.map(dumps) | records().map(lambda r: r[: len(r) // 2]))
    return draw(records())


@st.composite
def jsonl_files(draw: st.DrawFn) -> bytes:
    content = b"\n".join(draw(st.lists(lines() | st.sampled_from([b"", b"   ", b"\r"]), max_size=6)))
    if draw(st.booleans()):
        content += b"\n"
    if draw(st.integers(0, 3)) == 0:
        content = b"\xef\xbb\xbf" + content
    return content


@st.composite
def create_bodies(draw: st.DrawFn, file_ids: list[str]) -> bytes:
    """A create's body: the usual fields, some of them odd, missing or unknown, from a file or inline."""
    fields: dict[str, Any] = {"endpoint": draw(st.sampled_from([CHAT, CHAT, "odd"]).flatmap(
        lambda e: st.just(e) if e == CHAT else ENDPOINTS | JSON)), "completion_window": "24h"}
    if draw(st.booleans()):
        fields["input_file_id"] = draw(st.sampled_from(file_ids) | TEXT | JSON)
    else:
        fields["requests"] = [Raw(r) for r in draw(st.lists(records(), min_size=1, max_size=5))]
    odd_keys = st.sampled_from(["completion_window", "metadata", "priority", "requests", "input_file_id",
                                "output_expires_after", "completion_windows", "dry_run"]) | TEXT
    for key in draw(st.just([]) | st.lists(odd_keys, max_size=2)):
        fields[key] = draw(JSON | st.sampled_from(["24h", "expedited", "standard"])
                           | st.dictionaries(TEXT, TEXT, max_size=3))
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=60) | st.sampled_from([b"", b"[]", b"null", b"{", b"1e400"]))
    return dumps(fields)


# -- the client: one connection for the whole run ----------------------------------------------------------------


class OneConnection:
    """An ``httpx.Client`` that checks every answer and that every answer came over the same socket."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.client = httpx.Client(base_url=base_url, headers={"authorization": f"Bearer {api_key}"},
                                   limits=httpx.Limits(max_connections=1), timeout=60)
        self.local_port: int | None = None

    def request(self, method: str, path: str, route: str, **kwargs: Any) -> httpx.Response:
        resp = self.client.request(method, path, **kwargs)
        TALLY[f"{route} {resp.status_code}"] += 1
        where = f"{method} {path} {kwargs!r:.300}"
        assert resp.status_code < 500, f"{where} -> {resp.status_code} {resp.text[:500]}"
        assert resp.headers.get("connection", "").lower() != "close", f"{where}: the server closes the connection"
        sock: socket.socket = resp.extensions["network_stream"].get_extra_info("socket")
        port = sock.getsockname()[1]
        if self.local_port is None:
            self.local_port = port
        assert port == self.local_port, f"{where}: answered on a new connection (the last one was dropped)"
        if resp.status_code >= 400:
            assert resp.headers["content-type"].startswith("application/json"), f"{where}: {resp.text[:300]}"
            error = resp.json()["error"]
            assert ENVELOPE_KEYS <= set(error), error
            assert isinstance(error["message"], str) and error["message"], error
            assert isinstance(error["type"], str), error
        return resp

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def conn(make_server) -> Iterator[OneConnection]:
    # No worker: the fuzz is about what the API answers; what the worker does with odd records that were
    # accepted is tests/test_poison_records.py's.
    server = make_server(args=("--no-worker",))
    client = OneConnection(server.base_url, server.api_key)
    yield client
    client.close()
    assert "Traceback" not in server.log(), server.log()[-4000:]


def _upload(conn: OneConnection, content: bytes, **extra: Any) -> httpx.Response:
    return conn.request("POST", "/files", "upload", files={"file": ("in.jsonl", content)},
                        data={"purpose": "batch", **extra})


def _good_file(conn: OneConnection) -> str:
    resp = _upload(conn, orjson.dumps({"custom_id": "a", "method": "POST", "url": CHAT,
                                       "body": {"model": "test/echo", "messages": []}}) + b"\n")
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


# -- the properties ----------------------------------------------------------------------------------------------


def test_fuzzed_files_and_creates_from_them(conn: OneConnection) -> None:
    @FUZZ
    @given(content=jsonl_files(), endpoint=ENDPOINTS)
    def case(content: bytes, endpoint: str) -> None:
        resp = _upload(conn, content)
        assert resp.status_code == 200, resp.text
        file_id = resp.json()["id"]
        created = conn.request("POST", "/batches", "create-file", content=dumps(
            {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}),
            headers={"content-type": "application/json"})
        assert created.status_code in (200, 400), created.text

    case()
    print(f"\nfuzz tally: {dict(sorted(TALLY.items()))}")


def test_fuzzed_creates(conn: OneConnection) -> None:
    file_ids = [_good_file(conn)]

    @FUZZ
    @given(data=st.data())
    def case(data: st.DataObject) -> None:
        body = data.draw(create_bodies(file_ids))
        conn.request("POST", "/batches", "create", content=body, headers={"content-type": "application/json"})

    case()
    print(f"\nfuzz tally: {dict(sorted(TALLY.items()))}")


def test_fuzzed_metadata(conn: OneConnection) -> None:
    created = conn.request("POST", "/batches", "create", json={"input_file_id": _good_file(conn), "endpoint": CHAT,
                                                               "completion_window": "24h"})
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]

    @FUZZ
    @given(target=st.sampled_from([batch_id]) | TEXT,
           body=st.builds(lambda m: {"metadata": m}, JSON | st.dictionaries(TEXT, TEXT, max_size=40)) | JSON,
           raw=st.none() | st.binary(max_size=40))
    def case(target: str, body: Any, raw: bytes | None) -> None:
        conn.request("POST", f"/batches/{_path(target)}/metadata", "metadata",
                     content=raw if raw is not None else dumps(body), headers={"content-type": "application/json"})

    case()
    print(f"\nfuzz tally: {dict(sorted(TALLY.items()))}")


def test_fuzzed_queries_and_ids(conn: OneConnection) -> None:
    file_id = _good_file(conn)
    query = st.dictionaries(st.sampled_from(["limit", "after", "status", "model", "tag", "purpose", "x"]),
                            TEXT | st.integers().map(str) | st.sampled_from([file_id, "completed", "batch"]),
                            max_size=4)

    @FUZZ
    @given(route=st.sampled_from(["list-batches", "list-files", "get-batch", "get-file", "content", "delete",
                                  "cancel", "models", "upload-form"]),
           params=query, ident=TEXT | st.sampled_from([file_id, "batch_000000000000", "file-x"]),
           form=st.dictionaries(TEXT, TEXT, max_size=3))
    def case(route: str, params: dict[str, str], ident: str, form: dict[str, str]) -> None:
        path = _path(ident)
        if route == "list-batches":
            conn.request("GET", "/batches", route, params=params)
        elif route == "list-files":
            conn.request("GET", "/files", route, params=params)
        elif route == "get-batch":
            conn.request("GET", f"/batches/{path}", route, params=params)
        elif route == "get-file":
            conn.request("GET", f"/files/{path}", route)
        elif route == "content":
            conn.request("GET", f"/files/{path}/content", route)
        elif route == "delete":
            conn.request("DELETE", f"/files/{path}", route)
        elif route == "cancel":
            conn.request("POST", f"/batches/{path}/cancel", route)
        elif route == "models":
            conn.request("GET", "/models", route, params=params)
        else:
            fields = {k: v for k, v in form.items() if "\x00" not in k}
            conn.request("POST", "/files", route, data=fields,
                         files={"file": (ident or "f", b"{}\n")} if len(form) % 2 else None)

    case()
    print(f"\nfuzz tally: {dict(sorted(TALLY.items()))}")


def _path(text: str) -> str:
    """``text`` as one path segment, every reserved character escaped (an empty one is a route of its own)."""
    return quote(text, safe="") or "-"
