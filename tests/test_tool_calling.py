"""Tool calling inside a batch record (docs/api-contract.md §8): a real MCP server process, the test engine told to
call tools, real `orl serve` processes. Create rules already covered in test_create_rules.py are not repeated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.support import http_client
from tests.support.batches import chat, cost, create, get, results, usage_of, wait_for
from tests.support.mcp_server import running_mcp_server
from tests.support.server import catalog_text

METADATA_BY_NUMBER = "http://2852039166/mcp"  # 169.254.169.254 spelled as one number: only resolving tells


@pytest.fixture(scope="session")
def mcp_root() -> Iterator[str]:
    with running_mcp_server() as root:
        yield root


@pytest.fixture
def mcp(mcp_root: str) -> Iterator[McpServer]:
    server = McpServer(mcp_root)
    server.reset()
    yield server


class McpServer:
    def __init__(self, root: str) -> None:
        self.root = root
        self.url = root + "/mcp"

    def reset(self) -> None:
        http_client.post(self.root + "/calls/reset", timeout=10).raise_for_status()

    def calls(self) -> list[dict[str, Any]]:
        return http_client.get(self.root + "/calls", timeout=10).json()

    def deletes(self) -> list[dict[str, Any]]:
        """The sessions clients closed (an MCP DELETE each), with their tokens."""
        return http_client.get(self.root + "/deletes", timeout=10).json()


def tool_catalog(engine_url: str, *allow: str, slots: int = 2, **limits: float) -> str:
    """The test catalog with its own ``[tools]`` table."""
    return catalog_text(engine_url, slots=slots, tools=allow,
                        tool_limits="".join(f"{k} = {v}\n" for k, v in limits.items()))


def tool_record(custom_id: str, text: str, url: str, **config: Any) -> dict[str, Any]:
    record = chat(custom_id, text)
    server = {"url": url, **{k: config.pop(k) for k in ("headers", "allowed_tools") if k in config}}
    record["body"]["openrelay"] = {"tool_config": {"servers": [server], **config}}
    return record


def requests_of(engine, marker: str) -> list[dict[str, Any]]:
    """The engine requests of the record whose first user message carries ``marker``, in order."""
    return [r["body"] for r in engine.requests() if marker in r["body"]["messages"][0]["content"]]


def expected_usage(bodies: list[dict[str, Any]], completion_per_turn: int) -> dict[str, int]:
    """What the test engine charges for these requests: a word per prompt word, ``#tokens`` per answer."""
    prompt = sum(len(m["content"].split()) for b in bodies for m in b["messages"] if isinstance(m["content"], str))
    completion = completion_per_turn * len(bodies)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def names_offered(body: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


def test_tool_rounds_usage_and_what_the_engine_and_the_tool_server_received(make_server, engine, engine_url, mcp):
    server = make_server(catalog=tool_catalog(engine_url, mcp.url))
    headers = {"x-tool-token": "secret-7"}
    created = create(server, [
        tool_record("one-round", 'add please #call_tool=add:{"a":2,"b":3} #tokens=5', mcp.url, headers=headers,
                    allowed_tools=["add", "echo"]),
        tool_record("three-rounds", 'echo thrice #call_tool=echo:{"text":"ping"} #tool_rounds=3 #tokens=4',
                    mcp.url, headers=headers, max_rounds=3),
        tool_record("two-calls", 'both #call_tool=add:{"a":1,"b":1} #call_tool=echo:{"text":"too"}', mcp.url,
                    headers=headers),
    ])
    batch = server.wait(created["id"])
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    out, err = results(server, batch)
    assert err == {}

    one = out["one-round"]["response"]["body"]
    assert list(one)[-2:] == ["usage", "openrelay"] and one["openrelay"] == {"tool_rounds": 1}
    assert one["model"] == "test/echo" and one["object"] == "chat.completion"
    assert one["choices"][0]["message"] == {"role": "assistant", "content": "tool results: sum=5"}
    assert one["choices"][0]["finish_reason"] == "stop"
    turns = requests_of(engine, "add please")
    assert len(turns) == 2
    assert one["usage"] == expected_usage(turns, 5)

    three = out["three-rounds"]["response"]["body"]
    assert three["openrelay"] == {"tool_rounds": 3}
    assert three["choices"][0]["message"]["content"] == "tool results: ping | ping | ping"
    turns3 = requests_of(engine, "echo thrice")
    assert len(turns3) == 4
    assert three["usage"] == expected_usage(turns3, 4)

    two = out["two-calls"]["response"]["body"]  # two calls in one turn are one round
    assert two["openrelay"] == {"tool_rounds": 1}
    assert two["choices"][0]["message"]["content"] == "tool results: sum=2 | too"

    # Billing is the summed usage of every turn.
    assert batch["usage"] == usage_of(out)
    assert batch["usage"]["cost_nano_usd"] == sum(
        cost(b["usage"]["prompt_tokens"], b["usage"]["completion_tokens"]) for b in (one, three, two))

    # Every call: tool_config stripped (the openrelay object with it), the allowed server tools offered.
    for body in turns + turns3:
        assert "openrelay" not in body and body["model"] == "echo-served"
    assert {tuple(names_offered(b)) for b in turns} == {("add", "echo")}
    assert set(names_offered(turns3[0])) == {"add", "echo", "explode", "huge", "slow"}
    add_tool = next(t for t in turns[0]["tools"] if t["function"]["name"] == "add")
    assert add_tool["type"] == "function" and add_tool["function"]["description"] == "Add two integers."
    assert add_tool["function"]["parameters"]["properties"].keys() == {"a", "b"}

    # The second turn carries the model's call and the tool's result, joined by the call id.
    assistant, result = turns[1]["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["function"] == {
        "name": "add", "arguments": '{"a":2,"b":3}'}
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "sum=5"}
    assert len([m for m in turns3[-1]["messages"] if m["role"] == "tool"]) == 3

    calls = mcp.calls()
    assert sorted(c["tool"] for c in calls) == ["add", "add", "echo", "echo", "echo", "echo"]
    assert {c["token"] for c in calls} == {"secret-7"}  # the record's headers reached its server


def test_a_record_that_answers_at_once_looks_like_one_without_tool_config(make_server, engine, engine_url, mcp):
    server = make_server(catalog=tool_catalog(engine_url, mcp.url))
    batch = server.wait(create(server, [
        tool_record("with-tools", "what is the capital of France", mcp.url),
        chat("without", "what is the capital of France"),
    ])["id"])
    out, err = results(server, batch)
    assert err == {} and sorted(out) == ["with-tools", "without"]
    with_tools, without = (dict(out[k]["response"]["body"]) for k in ("with-tools", "without"))
    for body in (with_tools, without):  # the engine's own per-request values
        del body["id"], body["created"]
    assert orjson.dumps(with_tools) == orjson.dumps(without)
    assert "openrelay" not in with_tools
    assert batch["usage"] == usage_of(out)
    sent = engine.requests()
    assert len(sent) == 2 and all("openrelay" not in r["body"] for r in sent)
    offered = {tuple(names_offered(r["body"])) for r in sent}
    assert offered == {(), ("add", "echo", "explode", "huge", "slow")}
    assert mcp.calls() == []


def test_rounds_exceeded_is_an_error_line_and_not_billed(make_server, engine, engine_url, mcp):
    server = make_server(catalog=tool_catalog(engine_url, mcp.url))
    batch = server.wait(create(server, [
        tool_record("forever", 'loop #call_tool=echo:{"text":"again"} #tool_rounds=100', mcp.url, max_rounds=2),
        chat("plain", "plain record"),
    ])["id"])
    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    out, err = results(server, batch)
    line = err["forever"]
    assert line["response"] is None and line["id"] == "batch_req_forever"
    assert line["error"] == {"code": "tool_rounds_exceeded",
                             "message": "the model still called tools after max_rounds (2) tool rounds"}
    assert len(requests_of(engine, "loop")) == 3  # two rounds, then the third answer still calls a tool
    assert [c["tool"] for c in mcp.calls()] == ["echo", "echo"]
    assert batch["usage"] == usage_of(out)  # the failed record's turns are not billed


def test_tool_failures_are_the_tools_answer_and_limits_hold(make_server, engine, engine_url, mcp):
    catalog = tool_catalog(engine_url, mcp.url, call_timeout_seconds=1, record_timeout_seconds=4,
                           max_output_bytes=1000)
    server = make_server(catalog=catalog)
    batch = server.wait(create(server, [
        tool_record("raises", 'r #call_tool=explode:{"reason":"kaboom"}', mcp.url),
        tool_record("bad-args", 'b #call_tool=add:{"a":"two","b":3}', mcp.url),
        tool_record("not-json", "n #call_tool=add:{oops", mcp.url),
        tool_record("huge", 'h #call_tool=huge:{"size":200000}', mcp.url),
        tool_record("slow-once", 's #call_tool=slow:{"seconds":5}', mcp.url),
        tool_record("slow-always", 'a #call_tool=slow:{"seconds":5} #tool_rounds=10', mcp.url, max_rounds=10),
    ])["id"])
    out, err = results(server, batch)
    assert sorted(out) == ["bad-args", "huge", "not-json", "raises", "slow-once"]

    def answer(custom_id: str) -> str:
        body = out[custom_id]["response"]["body"]
        assert body["openrelay"] == {"tool_rounds": 1}
        return body["choices"][0]["message"]["content"]

    assert answer("raises") == "tool results: error: Error executing tool explode: exploded: kaboom"
    assert answer("bad-args").startswith("tool results: error: ") and "a" in answer("bad-args")
    assert answer("not-json") == "tool results: error: the arguments of add are not valid JSON"
    assert answer("slow-once") == "tool results: error: the call of slow timed out after 1 seconds"
    fed = requests_of(engine, "h #call_tool")[1]["messages"][-1]["content"]
    assert fed == "x" * 1000 + "\n[tool output cut to 1000 of its 200000 bytes]"

    # Calls timing out after a second each, for up to ten rounds, do not fit in 4 seconds of tool time.
    assert err["slow-always"]["error"] == {"code": "tool_timeout",
                                           "message": "the record spent its 4 seconds of tool-server time"}
    assert batch["usage"] == usage_of(out)


def test_a_call_of_the_records_own_tool_ends_the_loop(make_server, engine, engine_url, mcp):
    server = make_server(catalog=tool_catalog(engine_url, mcp.url))
    own = [{"type": "function", "function": {"name": "lookup_invoice", "parameters": {"type": "object"}}},
           {"type": "function", "function": {"name": "echo", "description": "the record's own echo"}}]
    first = tool_record("own-tool", 'o #call_tool=lookup_invoice:{"id":"7"}', mcp.url)
    shadow = tool_record("own-echo", 'e #call_tool=echo:{"text":"mine"}', mcp.url)
    for record in (first, shadow):
        record["body"]["tools"] = own
    batch = server.wait(create(server, [first, shadow])["id"])
    out, err = results(server, batch)
    assert err == {}
    for custom_id, name, arguments in (("own-tool", "lookup_invoice", '{"id":"7"}'),
                                       ("own-echo", "echo", '{"text":"mine"}')):
        body = out[custom_id]["response"]["body"]
        assert "openrelay" not in body
        assert body["choices"][0]["finish_reason"] == "tool_calls"
        assert body["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": name, "arguments": arguments}
    for marker in ("o #call_tool", "e #call_tool"):
        (sent,) = requests_of(engine, marker)
        # The record's own tools come first and win a name clash: the server's echo is not offered.
        assert sent["tools"][:2] == own
        assert names_offered(sent) == ["lookup_invoice", "echo", "add", "explode", "huge", "slow"]
    assert mcp.calls() == []


def test_servers_that_may_not_or_cannot_be_reached_fail_the_record(make_server, engine, engine_url, mcp):
    # The operator allows a host that is the metadata address in disguise, and a port where nothing listens.
    server = make_server(catalog=tool_catalog(engine_url, mcp.url, METADATA_BY_NUMBER, "http://127.0.0.1:9/mcp"))
    created = create(server, [
        tool_record("metadata", "m question", METADATA_BY_NUMBER),
        tool_record("nobody-home", "n question", "http://127.0.0.1:9/mcp"),
        tool_record("fine", 'f #call_tool=add:{"a":1,"b":1}', mcp.url),
    ])
    assert created["rejected_count"] == 0  # a name (or an odd spelling) is judged once it is resolved, at run time
    batch = server.wait(created["id"])
    out, err = results(server, batch)
    assert sorted(out) == ["fine"] and sorted(err) == ["metadata", "nobody-home"]
    assert err["metadata"]["error"] == {
        "code": "tool_server_not_allowed",
        "message": f"tool server {METADATA_BY_NUMBER} resolves to 169.254.169.254, a link-local or metadata "
                   "address; it is never contacted"}
    nobody = err["nobody-home"]["error"]
    assert nobody["code"] == "tool_server_unavailable" and set(nobody) == {"code", "message"}
    assert nobody["message"].startswith("tool server http://127.0.0.1:9/mcp: ")
    assert requests_of(engine, "m question") == [] and requests_of(engine, "n question") == []
    assert batch["usage"] == usage_of(out)


def test_a_server_that_never_answers_the_closing_of_its_session_holds_no_record(make_server, engine_url, mcp):
    # A handshake-era server gives each client a session, which the client closes with a DELETE; this one never
    # answers the DELETEs marked x-stall-delete.
    server = make_server(catalog=tool_catalog(engine_url, mcp.url, call_timeout_seconds=1, record_timeout_seconds=4))
    stall = {"x-legacy-mcp": "1", "x-stall-delete": "1", "x-tool-token": "stall"}
    batch = server.wait(create(server, [
        tool_record("answered", 'a #call_tool=add:{"a":1,"b":2}', mcp.url, headers=stall),
        tool_record("exceeded", 'x #call_tool=echo:{"text":"again"} #tool_rounds=100', mcp.url, headers=stall,
                    max_rounds=1),
        tool_record("polite", 'p #call_tool=add:{"a":2,"b":2}', mcp.url,
                    headers={"x-legacy-mcp": "1", "x-tool-token": "polite"}),
    ])["id"])
    assert batch["status"] == "completed"
    out, err = results(server, batch)
    # The records end as their loops did: closing the sessions, cut short, changes nothing.
    assert out["answered"]["response"]["body"]["choices"][0]["message"]["content"] == "tool results: sum=3"
    assert out["polite"]["response"]["body"]["choices"][0]["message"]["content"] == "tool results: sum=4"
    assert err["exceeded"]["error"] == {"code": "tool_rounds_exceeded",
                                        "message": "the model still called tools after max_rounds (1) tool rounds"}
    assert sorted((d["token"], d["stalled"]) for d in mcp.deletes()) == [
        ("polite", False), ("stall", True), ("stall", True)]
    assert batch["usage"] == usage_of(out)


def test_the_allow_list_is_checked_again_when_the_record_runs(make_server, engine, engine_url, mcp):
    server = make_server(catalog=tool_catalog(engine_url, mcp.url, slots=1))
    blocker = create(server, [chat("blocker", "hold the only slot #hold=blocker")])["id"]
    engine.wait_held("blocker")
    queued = create(server, [tool_record("late", 'l #call_tool=add:{"a":1,"b":2}', mcp.url)])["id"]
    server.kill()  # the tool record was accepted but has not run; the operator then withdraws the server
    engine.release("blocker")
    (server.data_dir / "catalog.toml").write_text(tool_catalog(engine_url, "http://127.0.0.1:9/mcp", slots=1))
    server.start()
    assert server.wait(blocker)["status"] == "completed"
    batch = server.wait(queued)
    out, err = results(server, batch)
    assert out == {} and err["late"]["error"] == {
        "code": "tool_server_not_allowed", "message": f"tool server {mcp.url} is not allowed by the operator"}
    assert requests_of(engine, "l #call_tool") == [] and mcp.calls() == []


def test_a_resumed_tool_loop_runs_again_from_the_start_and_is_billed_once(make_server, engine, engine_url, mcp):
    server = make_server(catalog=tool_catalog(engine_url, mcp.url))
    batch_id = create(server, [tool_record("resumed", 'k #call_tool=slow:{"seconds":3} #tokens=1', mcp.url)])["id"]
    wait_for(lambda: mcp.calls(), "the tool call to reach the tool server")
    server.kill()
    server.start()
    batch = server.wait(batch_id)
    out, err = results(server, batch)
    assert err == {} and batch["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    body = out["resumed"]["response"]["body"]
    assert body["openrelay"] == {"tool_rounds": 1}
    assert body["choices"][0]["message"]["content"] == "tool results: slept"
    assert [c["tool"] for c in mcp.calls()] == ["slow", "slow"]  # the loop ran again from its first turn
    turns = requests_of(engine, "k #call_tool")
    assert len(turns) == 3  # the first run's opening turn, then both turns of the second run
    assert body["usage"] == expected_usage(turns[1:], 1)
    assert get(server, batch_id)["usage"] == usage_of(out)


def test_create_rejects_tool_configs_that_could_never_run(server):
    def with_tools(custom_id: str, url: str, endpoint: str = "/v1/chat/completions") -> dict[str, Any]:
        record = chat(custom_id, "hi")
        if endpoint == "/v1/completions":
            record.update(url=endpoint, body={"model": "test/echo", "prompt": "hi"})
        record["body"]["openrelay"] = {"tool_config": {"servers": [{"url": url}]}}
        return record

    blocked = ["http://[::ffff:169.254.169.254]/mcp", "http://[fe80::1]/mcp", "http://[fd20:ce::254]/mcp",
               "http://100.100.100.200/mcp", "http://[64:ff9b::a9fe:a9fe]/mcp", "http://[2002:a9fe:a9fe::1]/mcp"]
    created = create(server, [*(with_tools(f"blocked-{n}", url) for n, url in enumerate(blocked)), chat("ok", "hi")])
    assert created["rejected_records"] == [
        {"line": n + 1, "custom_id": f"blocked-{n}", "code": "invalid_tool_config",
         "message": f"tool_config.servers[0]: url {url} points at a link-local or metadata address"}
        for n, url in enumerate(blocked)]

    # The reviewer's header: it would have reached the worker, whose HTTP client cannot encode it.
    cafe = with_tools("cafe", "http://127.0.0.1:9/mcp")
    cafe["body"]["openrelay"]["tool_config"]["servers"][0]["headers"] = {"Authorization": "Bearer café"}
    host = with_tools("host", "http://127.0.0.1:9/mcp")
    host["body"]["openrelay"]["tool_config"]["servers"][0]["headers"] = {"host": "internal.example"}
    created = create(server, [cafe, host, with_tools("userinfo", "http://me:pw@127.0.0.1:9/mcp"),
                              with_tools("suffix", "http://127.0.0.1:9/mcp.evil"), chat("ok", "hi")])
    assert created["rejected_records"] == [
        {"line": 1, "custom_id": "cafe", "code": "invalid_tool_config", "message": "tool_config.servers[0]: the "
         "value of header Authorization may hold only visible ASCII characters, spaces and tabs (encode anything "
         "else, e.g. as base64 or percent-encoding)"},
        {"line": 2, "custom_id": "host", "code": "invalid_tool_config",
         "message": "tool_config.servers[0]: header host is set by OpenRelay's MCP client and may not be given"},
        {"line": 3, "custom_id": "userinfo", "code": "invalid_tool_config", "message": "tool_config.servers[0]: "
         "url carries userinfo (user:password@ before the host); send credentials in headers"},
        {"line": 4, "custom_id": "suffix", "code": "invalid_tool_config",
         "message": "tool_config.servers[0]: tool server http://127.0.0.1:9/mcp.evil is not allowed by the operator"},
    ]
    allowed = "http://127.0.0.1:9/mcp"  # the test catalog's allow-list: only the endpoint is wrong
    completions = [with_tools("text", allowed, "/v1/completions"),
                   {"custom_id": "ok", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "test/echo", "prompt": "hi"}}]
    created = create(server, completions, endpoint="/v1/completions")
    assert created["rejected_records"] == [{
        "line": 1, "custom_id": "text", "code": "invalid_tool_config",
        "message": "tool_config works only with /v1/chat/completions and /v1/responses (this batch's endpoint is "
                   "/v1/completions)"}]
