"""The shape of ``body.openrelay.tool_config`` (docs/api-contract.md §8), checked at create time."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from ..catalog import Catalog
from ..egress import blocked_address

__all__ = ["tool_config_problem", "MAX_ROUNDS_LIMIT", "DEFAULT_MAX_ROUNDS", "TOOL_ENDPOINTS"]

DEFAULT_MAX_ROUNDS = 8
MAX_ROUNDS_LIMIT = 16
_SERVER_KEYS = {"url", "headers", "allowed_tools"}
TOOL_ENDPOINTS = ("/v1/chat/completions", "/v1/responses")  # the endpoints whose models call tools
# A header name is an RFC 7230 token; a value, visible ASCII, spaces and tabs (anything else breaks the request).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")
# Headers the HTTP client and the MCP transport set themselves. From a record they could point the request at
# another virtual host than the allow-list named (Host), desynchronise the connection (framing), or speak the
# protocol for the transport (Mcp-Session-Id, Mcp-Protocol-Version, ...).
_RESERVED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-type", "accept",
                     "keep-alive", "upgrade", "te", "trailer", "proxy-connection", "last-event-id"}


def tool_config_problem(config: Any, catalog: Catalog, endpoint: str) -> str | None:
    """Why ``config`` is not an acceptable tool_config, or None when it is."""
    if not isinstance(config, dict):
        return "tool_config must be a JSON object"
    if endpoint not in TOOL_ENDPOINTS:
        return (f"tool_config works only with {' and '.join(TOOL_ENDPOINTS)} "
                f"(this batch's endpoint is {endpoint})")
    extra = sorted(set(config) - {"servers", "max_rounds"})
    if extra:
        return f'tool_config has an unknown field "{extra[0]}"'
    servers = config.get("servers")
    if not isinstance(servers, list) or not servers:
        return "tool_config.servers must be a non-empty list"
    for i, server in enumerate(servers):
        problem = _server_problem(server, catalog)
        if problem is not None:
            return f"tool_config.servers[{i}]: {problem}"
    rounds = config.get("max_rounds", DEFAULT_MAX_ROUNDS)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS_LIMIT:
        return f"tool_config.max_rounds must be an integer from 1 to {MAX_ROUNDS_LIMIT}"
    return None


def _server_problem(server: Any, catalog: Catalog) -> str | None:
    if not isinstance(server, dict):
        return "must be a JSON object"
    extra = sorted(set(server) - _SERVER_KEYS)
    if extra:
        return f'unknown field "{extra[0]}"'
    url = server.get("url")
    if not isinstance(url, str):
        return "url must be a string"
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed [IPv6 address, say
        return "url must be an http(s) URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "url must be an http(s) URL"
    if "@" in parts.netloc:  # not echoed: it may hold a password
        return "url carries userinfo (user:password@ before the host); send credentials in headers"
    if _blocked_host(parts.hostname):
        return f"url {url} points at a link-local or metadata address"
    if not catalog.tool_url_allowed(url):
        return f"tool server {url} is not allowed by the operator"
    problem = _headers_problem(server.get("headers", {}))
    if problem is not None:
        return problem
    tools = server.get("allowed_tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
        return "allowed_tools must be a list of strings"
    return None


def _headers_problem(headers: Any) -> str | None:
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in headers.items()):
        return "headers must map strings to strings"
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            return f"header name {name!r} is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"
        if name.lower() in _RESERVED_HEADERS or name.lower().startswith("mcp-"):
            return f"header {name} is set by OpenRelay's MCP client and may not be given"
        if not _HEADER_VALUE.fullmatch(value):
            return (f"the value of header {name} may hold only visible ASCII characters, spaces and tabs "
                    "(encode anything else, e.g. as base64 or percent-encoding)")
    return None


def _blocked_host(host: str) -> bool:
    """A literal address is judged here; a host name (or an odd numeric spelling) when the record runs, after
    it is resolved: what a name points at can change between create and run (``egress``)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return blocked_address(address)
