"""The outbound-network guard: HTTP clients for tool servers and webhook endpoints that never reach a link-local or
cloud metadata address, nor a URL outside the allow-list they are given.

The address check is made by the connection itself: it resolves the host, refuses it if any address it resolves
to is blocked, and connects to an address it checked. A separate check before connecting would leave a gap: a
name can resolve to a harmless address for the check and to a blocked one for the connection (DNS rebinding).
The allow-list is checked on every request the client sends, not only on the URL it was given: the MCP SDK
follows a redirect that stays on the server's origin, and a 307 from ``/mcp`` to ``/admin`` would otherwise
carry the record's headers to a path the operator never allowed.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from collections.abc import Callable
from typing import Any

import anyio
import httpcore2
import httpx2

__all__ = ["IpAddress", "BlockedAddress", "blocked_address", "carried_address", "checked_client",
           "link_local_or_metadata"]


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Link-local (IPv4 and IPv6) and the cloud metadata addresses: never reached, whatever an allow-list says.
# 169.254.169.254 serves AWS, GCP, Azure and Oracle; fd00:ec2::254 is AWS's IPv6 one, fd20:ce::254 GCP's,
# 100.100.100.200 Alibaba's, 168.63.129.16 Azure's host agent (WireServer).
_BLOCKED_NETS = tuple(ipaddress.ip_network(net) for net in (
    "169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "fd20:ce::254/128", "100.100.100.200/32",
    "168.63.129.16/32"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known NAT64 prefix: its last 32 bits are an IPv4 address


def blocked_address(address: IpAddress) -> bool:
    """Whether ``address`` is link-local or a metadata address, also when an IPv6 address carries it as an
    IPv4 one (``carried_address``)."""
    address = carried_address(address)
    return any(address in net for net in _BLOCKED_NETS)


def carried_address(address: IpAddress) -> IpAddress:
    """The IPv4 address an IPv6 one carries, IPv4-mapped (``::ffff:a.b.c.d``), NAT64 (``64:ff9b::a.b.c.d``) or
    6to4 (``2002:aabb:ccdd::``), since that is where it leads; else ``address`` itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address


def link_local_or_metadata(address: IpAddress) -> str | None:
    """Why a tool server may not be reached at ``address``, or None: never a link-local or metadata one."""
    return "a link-local or metadata address" if blocked_address(address) else None


def checked_client(headers: dict[str, str], timeout: httpx2.Timeout, url_allowed: Callable[[str], bool],
                   address_refused: Callable[[IpAddress], str | None] = link_local_or_metadata,
                   ) -> httpx2.AsyncClient:
    """A client that sends only requests whose URL ``url_allowed`` accepts, and connects only to addresses
    ``address_refused`` finds nothing against (webhooks pass a stricter one). No proxy from the environment
    either: the address checked must be the one connected to."""
    return httpx2.AsyncClient(headers=headers, timeout=timeout,
                              transport=_CheckedTransport(url_allowed, address_refused), trust_env=False)


class BlockedAddress(OSError):
    """A request the client will not send: its host resolved to an address the client refuses (link-local or
    metadata, or an address the webhook's rule refuses), or its URL is outside the allow-list. ``str()`` completes
    "tool server URL ..." or "the endpoint's host ..."."""


class _CheckedBackend(httpcore2.AsyncNetworkBackend):
    """Resolves each host itself and connects only to addresses it has just checked."""

    def __init__(self, address_refused: Callable[[IpAddress], str | None]) -> None:
        self._inner = httpcore2.AnyIOBackend()
        self._address_refused = address_refused

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore2.AsyncNetworkStream:
        with anyio.fail_after(timeout):
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        for address in addresses:
            why = self._address_refused(address)
            if why is not None:
                raise BlockedAddress(f"resolves to {address}, {why}")
        failure: Exception = OSError(f"{host} resolves to no address")
        for address in addresses:
            try:
                return await self._inner.connect_tcp(str(address), port, timeout=timeout,
                                                     local_address=local_address, socket_options=socket_options)
            except httpcore2.ConnectError as exc:
                failure = exc
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _CheckedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's own transport, its connection pool on ``_CheckedBackend`` (the pool is the one place httpx2
    lets a network backend in; ``_pool`` is its name in the pinned httpx2 version)."""

    def __init__(self, url_allowed: Callable[[str], bool],
                 address_refused: Callable[[IpAddress], str | None]) -> None:
        super().__init__(verify=_ssl_context(), trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=_ssl_context(),
                                                   network_backend=_CheckedBackend(address_refused))
        self._url_allowed = url_allowed

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self._url_allowed(str(request.url)):
            raise BlockedAddress(f"led to a request for {request.url}, which the operator does not allow")
        return await super().handle_async_request(request)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One for every connection: making one loads the CA store, a tenth of a second that blocks the loop."""
    return httpx2.create_ssl_context(trust_env=False)
