"""The shape of ``body.openrelay.tool_config`` (CONTRACT section 8), checked at create time."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from ..catalog import Catalog

__all__ = ["tool_config_problem", "blocked_address", "MAX_ROUNDS_LIMIT", "DEFAULT_MAX_ROUNDS"]

DEFAULT_MAX_ROUNDS = 8
MAX_ROUNDS_LIMIT = 16
_SERVER_KEYS = {"url", "headers", "allowed_tools"}
TOOL_ENDPOINT = "/v1/chat/completions"  # the only endpoint whose models call tools
# Link-local (IPv4 and IPv6) and the cloud metadata addresses: never a tool server, whatever the allow-list says.
_BLOCKED_NETS = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"),
                 ipaddress.ip_network("fd00:ec2::254/128"))


def tool_config_problem(config: Any, catalog: Catalog, endpoint: str) -> str | None:
    """Why ``config`` is not an acceptable tool_config, or None when it is."""
    if not isinstance(config, dict):
        return "tool_config must be a JSON object"
    if endpoint != TOOL_ENDPOINT:
        return f"tool_config works only with {TOOL_ENDPOINT} (this batch's endpoint is {endpoint})"
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
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "url must be an http(s) URL"
    if _blocked_host(parts.hostname):
        return f"url {url} points at a link-local or metadata address"
    if not catalog.tool_url_allowed(url):
        return f"tool server {url} is not allowed by the operator"
    headers = server.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in headers.items()):
        return "headers must map strings to strings"
    tools = server.get("allowed_tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
        return "allowed_tools must be a list of strings"
    return None


def blocked_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is link-local or a metadata address, also when written as IPv4-mapped IPv6."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in _BLOCKED_NETS)


def _blocked_host(host: str) -> bool:
    """A literal address is judged here; a host name (or an odd numeric spelling) when the record runs, after
    it is resolved: what a name points at can change between create and run."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return blocked_address(address)
