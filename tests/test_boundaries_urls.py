"""The tool allow-list compares normalized URLs (issue 11, part 2), at create and when a record runs, and the
worker connects to the normalized URL: a tool server is never asked for a path the allow-list did not cover.

A recording HTTP server stands where the operator allowed ``/mcp``; it notes the request target of everything it
is asked for, exactly as it arrived, so the tests see what a server at that address would have served."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from openrelay.catalog import parse_catalog
from openrelay.errors import CatalogError
from tests.support.batches import create, results
from tests.support.mcp_server import running_mcp_server
from tests.support.server import catalog_text


class _Recorder(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.requests: list[tuple[str, str]] = []  # (method, request target as sent)
        self.root = f"http://127.0.0.1:{self.server_address[1]}"

    def paths(self) -> set[str]:
        return {path for _, path in self.requests}


class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    """Notes every request; ``/mcp/hop`` answers a same-origin 307 to ``/admin`` (the MCP SDK follows such
    redirects), everything else 404."""

    server: _Recorder

    def _answer(self) -> None:
        self.server.requests.append((self.command, self.path))
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path == "/mcp/hop":
            self.send_response(307)
            self.send_header("location", "/admin")
        else:
            self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def mcp_root() -> Iterator[str]:
    with running_mcp_server() as root:
        yield root


def tool_catalog(engine_url: str, *allow: str, slots: int = 2) -> str:
    return catalog_text(engine_url, slots=slots, tools=allow)


def tool_record(custom_id: str, url: str, text: str = "hi") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "test/echo", "messages": [{"role": "user", "content": f"{custom_id}: {text}"}],
                     "openrelay": {"tool_config": {"servers": [{"url": url}]}}}}


# Each one normalizes to a path outside /mcp, or has a shape servers read in more than one way.
ESCAPING = ["/mcp/../admin", "/mcp/./../secret", "/mcp/%2e%2e/admin", "/mcp/%2E%2e/admin", "/mcp/.%2e/admin",
            "/mcp/%2e./admin", "/mcp//../admin", "/mcp/a/../../admin", "/mcp/..", "/mcp/../mcpx", "/mcpx",
            "/mcp/%2fadmin", "/mcp/%2F..%2Fadmin", "/mcp/%5c..%5cadmin", "/mcp/..;/admin", "/mcp/%zz"]
# Each one normalizes to /mcp/y: the server must be asked for /mcp/y, and nothing else.
INSIDE = ["/mcp/x/%2e%2e/y", "/mcp/./y", "//mcp//y", "/mcp/%79", "/mcp/x/y/.%2E/%2e%2E/y"]


def test_dot_segments_cannot_leave_the_allowed_path_and_the_server_is_asked_for_the_normalized_one(
        make_server, engine, engine_url, recorder, mcp_root):
    server = make_server(catalog=tool_catalog(engine_url, recorder.root + "/mcp", mcp_root + "/mcp"))
    records = [tool_record(f"out-{n}", recorder.root + path) for n, path in enumerate(ESCAPING)]
    records += [tool_record(f"in-{n}", recorder.root + path) for n, path in enumerate(INSIDE)]
    records.append(tool_record("hop", recorder.root + "/mcp/hop"))
    # The real MCP server, named through a path that normalizes to its allowed endpoint.
    records.append(tool_record("mcp", mcp_root + "/tools/%2e%2e/mcp", 'add #call_tool=add:{"a":2,"b":3}'))
    created = create(server, records)
    assert created["rejected_records"] == [
        {"line": n + 1, "custom_id": f"out-{n}", "code": "invalid_tool_config",
         "message": f"tool_config.servers[0]: tool server {recorder.root + path} is not allowed by the operator"}
        for n, path in enumerate(ESCAPING)]

    batch = server.wait(created["id"])
    out, err = results(server, batch)
    assert out["mcp"]["response"]["body"]["choices"][0]["message"]["content"] == "tool results: sum=5"
    ran = {custom_id: line for custom_id, line in err.items() if not custom_id.startswith("out-")}
    assert sorted(ran) == sorted([*(f"in-{n}" for n in range(len(INSIDE))), "hop"])
    assert {err[f"in-{n}"]["error"]["code"] for n in range(len(INSIDE))} == {"tool_server_unavailable"}
    # The redirect to /admin stays on the server's origin, which the MCP SDK would follow: the client refuses it.
    assert err["hop"]["error"] == {
        "code": "tool_server_not_allowed",
        "message": f"tool server {recorder.root}/mcp/hop led to a request for {recorder.root}/admin, which the "
                   "operator does not allow; it is never contacted"}
    assert recorder.paths() == {"/mcp/y", "/mcp/hop"}  # never /admin, /secret, nor a path with dots in it


def test_the_run_time_check_normalizes_too(make_server, engine_url, recorder):
    # Accepted while the whole server was allowed; the operator then narrows the allow-list to /mcp.
    server = make_server(catalog=tool_catalog(engine_url, recorder.root + "/"), args=("--no-worker",))
    created = create(server, [tool_record("admin", recorder.root + "/mcp/../admin"),
                              tool_record("secret", recorder.root + "/mcp/./../secret"),
                              tool_record("encoded", recorder.root + "/mcp/%2e%2e/admin"),
                              tool_record("inside", recorder.root + "/mcp/x/%2e%2e/y")])
    assert created["rejected_count"] == 0
    server.stop()
    (server.data_dir / "catalog.toml").write_text(tool_catalog(engine_url, recorder.root + "/mcp"))
    server.args.remove("--no-worker")
    server.start()
    batch = server.wait(created["id"])
    out, err = results(server, batch)
    assert out == {} and sorted(err) == ["admin", "encoded", "inside", "secret"]
    for custom_id, path in (("admin", "/mcp/../admin"), ("secret", "/mcp/./../secret"),
                            ("encoded", "/mcp/%2e%2e/admin")):
        assert err[custom_id]["error"] == {
            "code": "tool_server_not_allowed",
            "message": f"tool server {recorder.root + path} is not allowed by the operator"}
    assert err["inside"]["error"]["code"] == "tool_server_unavailable"
    assert recorder.paths() == {"/mcp/y"}


def _allows(entry: str, url: str) -> bool:
    return parse_catalog(f'[tools]\nallow = ["{entry}"]\n').tool_url_allowed(url)


@pytest.mark.parametrize(("entry", "url", "allowed"), [
    ("http://h/mcp", "http://h/mcp", True),
    ("http://h/mcp", "http://h/mcp/", True),
    ("http://h/mcp", "http://h/mcp/x", True),
    ("http://h/mcp/", "http://h/mcp", True),  # an entry's trailing slash changes nothing
    ("http://h/mcp/", "http://h/mcp/x", True),
    ("http://h/mcp/", "http://h/mcpx", False),
    ("http://h/mcp", "http://h/mcpx", False),
    ("http://h/mcp", "http://h/mcp/..", False),
    ("http://h/mcp", "http://h/mcp/x/..", True),
    ("http://h/mcp", "http://h//mcp", True),
    ("http://h/a/../mcp", "http://h/mcp/x", True),  # allow entries are normalized the same way
    ("http://h/a/%2e%2e/mcp", "http://h/a/x", False),
    ("http://h/", "http://h/anything/../else", True),
    ("http://h/", "http://h/%2fetc", False),  # an encoded slash is refused whatever the entry
    ("http://h/mcp", "http://H:80/mcp", True),
    ("http://h/mcp", "https://h/mcp", False),
    ("http://h/mcp", "http://h:81/mcp", False),
    ("http://h/mcp", "http://u@h/mcp", False),
    ("http://h/mcp", "http://h/mcp\\..\\admin", False),
])
def test_allow_entries_and_urls_are_compared_normalized(entry, url, allowed):
    assert _allows(entry, url) is allowed


def test_a_catalog_allow_entry_that_cannot_be_normalized_stops_the_catalog():
    with pytest.raises(CatalogError, match="encoded slash"):
        parse_catalog('[tools]\nallow = ["http://h/mcp%2Fadmin"]\n')
