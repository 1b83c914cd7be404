"""The tool loop of a record carrying ``body.openrelay.tool_config``: connect to its MCP servers, offer their tools
beside the record's own, run the model's calls and ask again until it answers without a server tool (usage summed
over every turn). A tool server's failure ends at most its record. The rules: docs/tool-calling.md."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import orjson
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Tool

from ..catalog import Catalog
from ..egress import BlockedAddress, checked_client
from ..engines.base import EngineReply
from ..validation.tool_config import DEFAULT_MAX_ROUNDS
from .tool_budget import ToolBudget
from .tool_errors import ToolLoopFailed, describe, failure_of, failure_of_group, found_in
from .tool_shapes import ToolCall, ToolShape, shape_for

__all__ = ["ModelCall", "ToolLoopFailed", "run_tool_loop"]

ModelCall = Callable[[dict[str, Any]], Awaitable[EngineReply]]

_LIST_PAGES = 100  # a server whose tool listing never ends cannot hold a record forever
logging.getLogger("httpx2").setLevel(logging.WARNING)  # mcp's HTTP client logs every request at INFO


async def run_tool_loop(body: dict[str, Any], config: dict[str, Any], call_model: ModelCall,
                        catalog: Catalog, endpoint: str) -> EngineReply:
    """The record's final reply. ``body`` is what the model may see (tool_config already stripped);
    ``call_model`` makes one model call with the worker's retries; ``endpoint`` (chat completions or responses)
    decides how tools are offered and calls read (``tool_shapes``). Raises ``ToolLoopFailed``, or what
    ``call_model`` raised; never anything else, so no record can bring down the batch that runs it."""
    budget = ToolBudget(catalog.tool_limits)
    model_errors: list[BaseException] = []
    ended: list[EngineReply | Exception] = []  # how the loop ended, should closing its sessions run out of time

    async def call(request: dict[str, Any]) -> EngineReply:
        try:
            return await call_model(request)
        except BaseException as exc:  # only noted, to tell it from a tool-server failure below
            model_errors.append(exc)
            raise

    # The MCP sessions live in anyio task groups, which wrap whatever crosses them in exception groups: the
    # loop's own exceptions (ours, or the worker's from call_model) leave here as they were raised; a failure
    # inside a session's background tasks, or any other exception from talking to a server, becomes the record's
    # tool_server_unavailable.
    failure: BaseException | None = None
    try:
        with budget.setup_scope:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    ended.append(await _connected_loop(stack, body, config, call, catalog, budget,
                                                       shape_for(endpoint)))
                except Exception as exc:
                    ended.append(exc)
                    raise
    except BaseExceptionGroup as group:
        failure = failure_of_group(group, model_errors)
    except Exception as exc:
        failure = failure_of(exc, model_errors)
    first = ended[0] if ended else None
    if isinstance(first, EngineReply) and (failure is None or isinstance(failure, ToolLoopFailed)):
        return first  # the model answered: closing the sessions, failed or cut short, changes nothing
    if failure is not None:
        raise failure from None
    if isinstance(first, Exception):  # the loop failed, then closing the sessions ran out of time (ToolBudget.closing)
        raise failure_of(first, model_errors) from None
    budget.next_timeout()  # here only when a setup step ran out of time: the record's, or else the step's own
    raise ToolLoopFailed("tool_server_unavailable", f"{budget.step} timed out")


async def _connected_loop(stack: contextlib.AsyncExitStack, body: dict[str, Any], config: dict[str, Any],
                          call_model: ModelCall, catalog: Catalog, budget: ToolBudget, shape: ToolShape) -> EngineReply:
    own_tools = found if isinstance(found := body.get("tools"), list) else []
    own_names = {shape.defined_name(t) for t in own_tools}
    routes: dict[str, Client] = {}
    offered: list[dict[str, Any]] = []
    for server in config["servers"]:
        client = await _connect(stack, server, catalog, budget)
        for tool in await _list_tools(client, server, budget):
            if tool.name not in own_names and tool.name not in routes:  # the record's own tools win
                routes[tool.name] = client
                offered.append(shape.offered(tool))
    request = {**body, "tools": [*own_tools, *offered]} if offered else body
    return await _loop(request, routes, config.get("max_rounds", DEFAULT_MAX_ROUNDS), call_model, budget, shape)


async def _loop(request: dict[str, Any], routes: dict[str, Client], max_rounds: int, call_model: ModelCall,
                budget: ToolBudget, shape: ToolShape) -> EngineReply:
    conversation = shape.conversation(request)
    if conversation is None:  # nothing to append to: the engine says what is wrong with the body
        return await call_model(request)
    rounds = 0
    usage: dict[str, Any] = {}
    while True:
        reply = await call_model(request)
        if not 200 <= reply.status_code < 300:
            return reply
        _add_usage(usage, reply.body.get("usage"))
        calls = shape.calls(reply.body)
        # No call, or a call of a tool the record defined itself: the answer goes back to the user as is.
        if not calls or not all(call.name in routes for call in calls):
            return _final(reply, rounds, usage)
        if rounds == max_rounds:
            raise ToolLoopFailed("tool_rounds_exceeded",
                                 f"the model still called tools after max_rounds ({max_rounds}) tool rounds")
        rounds += 1
        results = [await _run_call(call, routes, budget) for call in calls]
        request, conversation = shape.continued(request, conversation, reply.body, calls, results)


def _final(reply: EngineReply, rounds: int, usage: dict[str, Any]) -> EngineReply:
    """A record that answered at once is exactly what the engine said, as if it had no tool_config."""
    if rounds == 0:
        return reply
    body = {**reply.body, "usage": usage} if usage else dict(reply.body)
    body["openrelay"] = {"tool_rounds": rounds}
    return EngineReply(reply.status_code, body)


# -- tool servers ------------------------------------------------------------------------------------------------


async def _connect(stack: contextlib.AsyncExitStack, server: dict[str, Any], catalog: Catalog,
                   budget: ToolBudget) -> Client:
    url = server["url"]
    # The normalized URL is the one connected to: the server is asked for exactly the path the allow-list
    # compared (``/mcp/x/%2e%2e/y`` is sent as ``/mcp/y``), and the HTTP client checks every request it sends,
    # a redirect the MCP SDK follows included.
    target = catalog.allowed_tool_url(url)
    if target is None:
        raise ToolLoopFailed("tool_server_not_allowed", f"tool server {url} is not allowed by the operator")
    # No HTTP read timeout: it would fire inside the SDK's background tasks and tear the session down; our
    # cancel scopes time every wait instead.
    timeout = httpx2.Timeout(budget.limits.call_timeout_seconds, read=None)
    with budget.setting_up(f"tool server {url}: connecting"):
        try:  # making the HTTP client too: it encodes the record's headers
            http = await stack.enter_async_context(checked_client(server.get("headers") or {}, timeout,
                                                                  catalog.tool_url_allowed))
            client = Client(streamable_http_client(target, http_client=http))
            await stack.enter_async_context(client)
        except Exception as exc:
            blocked = found_in(exc, BlockedAddress)
            if blocked is not None:
                raise ToolLoopFailed("tool_server_not_allowed",
                                     f"tool server {url} {blocked}; it is never contacted") from None
            raise ToolLoopFailed("tool_server_unavailable", f"tool server {url}: {describe(exc)}") from None
    stack.callback(budget.closing)  # runs before this session (and any opened before it) is closed
    return client


async def _list_tools(client: Client, server: dict[str, Any], budget: ToolBudget) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    with budget.setting_up(f"tool server {server['url']}: listing its tools"):
        try:
            for _ in range(_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if cursor is None:
                    break
        except Exception as exc:
            raise ToolLoopFailed("tool_server_unavailable",
                                 f"tool server {server['url']}: listing its tools failed: {describe(exc)}") from None
    allowed = server.get("allowed_tools")
    return [tool for tool in tools if allowed is None or tool.name in allowed]


async def _run_call(call: ToolCall, routes: dict[str, Client], budget: ToolBudget) -> str:
    """The text the model gets back: the tool's result, or what went wrong with the call."""
    name = call.name
    assert name is not None  # only calls of routed tools run
    raw = call.arguments or "{}"
    try:
        arguments = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        return f"error: the arguments of {name} are not valid JSON"
    if not isinstance(arguments, dict):
        return f"error: the arguments of {name} must be a JSON object"
    try:
        result = await budget.run(routes[name].call_tool(name, arguments))
    except TimeoutError:
        budget.next_timeout()
        return f"error: the call of {name} timed out after {budget.limits.call_timeout_seconds:g} seconds"
    except Exception as exc:
        return f"error: {describe(exc)}"
    text = _result_text(result)
    return _capped(f"error: {text}" if result.is_error else text, budget.limits.max_output_bytes)


def _result_text(result: CallToolResult) -> str:
    parts = [block.text if block.type == "text" else f"[{block.type} content omitted]" for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content).decode())
    return "\n".join(parts)


def _capped(text: str, limit: int) -> str:
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore") + f"\n[tool output cut to {limit} of its {len(raw)} bytes]"


# -- usage ----------------------------------------------------------------------------------------------


def _add_usage(total: dict[str, Any], usage: Any) -> None:
    """Add every count in ``usage`` (nested details too) into ``total``."""
    if not isinstance(usage, dict):
        return
    for key, value in usage.items():
        if isinstance(value, int) and not isinstance(value, bool):
            if isinstance(total.get(key, 0), int):
                total[key] = total.get(key, 0) + value
        elif isinstance(value, dict) and isinstance(total.setdefault(key, {}), dict):
            _add_usage(total[key], value)
