"""Where a webhook may be sent: the same network safety as tool servers (``egress.py``). A literal address is judged
when the endpoint is registered, a host name at every delivery by the connection itself, which connects only to an
address it checked. The rules: docs/webhooks.md, "Which addresses"."""

from __future__ import annotations

import functools
import ipaddress
import re

import httpx2

from ..catalog import Catalog
from ..egress import IpAddress, blocked_address, carried_address, checked_client
from ..urls import UrlRefused, normalized_http_url

__all__ = ["MAX_URL_LENGTH", "address_refusal", "webhook_url_problem", "webhook_client"]

MAX_URL_LENGTH = 2048
# A host whose last label is a number is an IPv4 address to URL parsers and resolvers (WHATWG's "ends in a
# number"), never a name; ``ipaddress`` reads only its usual form.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")


def address_refusal(address: IpAddress, *, private_allowed: bool) -> str | None:
    """Why a delivery may not connect to ``address``, or None."""
    if blocked_address(address):
        return "a link-local or metadata address"
    carried = carried_address(address)
    if carried.is_unspecified or carried.is_multicast or (carried.is_reserved and not carried.is_loopback):
        return "an address no delivery can reach (unspecified, multicast, reserved or IPv4-compatible IPv6)"
    if not carried_address(address).is_global and not private_allowed:
        return "a loopback or private address, which the operator's [webhooks] allow does not list"
    return None


def webhook_url_problem(url: object, catalog: Catalog) -> str | None:
    """Why ``url`` cannot be a webhook endpoint's URL, or None."""
    if not isinstance(url, str) or not url:
        return "url must be an http(s) URL"
    if len(url) > MAX_URL_LENGTH:
        return f"url must be at most {MAX_URL_LENGTH} characters"
    try:
        target = normalized_http_url(url)
    except UrlRefused as exc:
        return f"url {exc}"
    if len(target.url) > MAX_URL_LENGTH:  # normalizing may add a slash ("http://h" is "http://h/")
        return f"url must be at most {MAX_URL_LENGTH} characters"
    try:
        literal = ipaddress.ip_address(target.host)
    except ValueError:
        if _NUMERIC_LABEL.fullmatch(target.host.rstrip(".").rsplit(".", 1)[-1]):
            return (f"url host {target.host} is an IPv4 address in a form resolvers read differently (octal, hex, "
                    "leading zeros, fewer than four parts); write it as four decimal numbers")
        return None  # a name: judged at each delivery, after it is resolved
    why = address_refusal(literal, private_allowed=catalog.webhook_private_allowed(target.url))
    return None if why is None else f"url {target.url} points at {why}"


def normalized(url: str) -> str:
    """The URL as it is stored and connected to (``webhook_url_problem`` accepted it)."""
    return normalized_http_url(url).url


def webhook_client(url: str, catalog: Catalog, timeout: float) -> httpx2.AsyncClient:
    """A client that posts to exactly ``url`` (no other URL, redirects not followed) and connects only to
    addresses ``address_refusal`` lets through for it."""
    target = normalized(url)
    refusal = functools.partial(address_refusal, private_allowed=catalog.webhook_private_allowed(target))
    return checked_client({}, httpx2.Timeout(timeout), functools.partial(_is_target, target), refusal)


def _is_target(target: str, url: str) -> bool:
    try:
        return normalized_http_url(url).url == target
    except UrlRefused:
        return False
