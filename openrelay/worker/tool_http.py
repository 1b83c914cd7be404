"""HTTP clients for tool servers that never reach a link-local or cloud metadata address.

The check is made by the connection itself: it resolves the host, refuses it if any address it resolves to is
blocked, and connects to an address it checked. A separate check before connecting would leave a gap: a name
can resolve to a harmless address for the check and to a blocked one for the connection (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from typing import Any

import anyio
import httpcore2
import httpx2

from ..validation.tool_config import blocked_address

__all__ = ["BlockedAddress", "checked_client"]


def checked_client(headers: dict[str, str], timeout: httpx2.Timeout) -> httpx2.AsyncClient:
    """No proxy from the environment either: the address checked must be the one connected to."""
    return httpx2.AsyncClient(headers=headers, timeout=timeout, transport=_CheckedTransport(), trust_env=False)


class BlockedAddress(OSError):
    """A tool server's host resolved to a link-local or metadata address."""


class _CheckedBackend(httpcore2.AsyncNetworkBackend):
    """Resolves each host itself and connects only to addresses it has just checked."""

    def __init__(self) -> None:
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore2.AsyncNetworkStream:
        with anyio.fail_after(timeout):
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        for address in addresses:
            if blocked_address(address):
                raise BlockedAddress(f"resolves to {address}, a link-local or metadata address")
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

    def __init__(self) -> None:
        super().__init__(verify=_ssl_context(), trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=_ssl_context(), network_backend=_CheckedBackend())


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One for every connection: making one loads the CA store, a tenth of a second that blocks the loop."""
    return httpx2.create_ssl_context(trust_env=False)
