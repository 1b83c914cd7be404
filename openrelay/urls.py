"""http(s) URLs in the one form an allow-list compares and a client then connects to: normalized (scheme and host
lower-cased, the port explicit, escapes of unreserved characters decoded, runs of slashes merged, dot segments
removed), or refused where servers would read them in more than one way. Each rule, and why: docs/design.md,
"URLs in one form"."""

from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["HttpUrl", "UrlRefused", "normalized_http_url"]

_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_SLASHES = re.compile(r"/{2,}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class UrlRefused(ValueError):
    """A URL that is not an http(s) URL this module can put in one unambiguous form; ``str()`` says why."""


@dataclass(frozen=True, kw_only=True)
class HttpUrl:
    scheme: str
    host: str  # lower-case; an IPv6 address without its brackets
    port: int  # explicit, the scheme's default when the URL names none
    path: str  # normalized: starts with "/", no dot segments, no empty segments but a trailing slash
    url: str  # the whole normalized URL: what a client connects to

    def covers(self, other: HttpUrl) -> bool:
        """Whether ``other`` is this URL's origin and its path or one under it. ``/mcp`` and ``/mcp/`` cover
        ``/mcp``, ``/mcp/`` and ``/mcp/x``, not ``/mcpx``; ``/`` covers every path."""
        if (self.scheme, self.host, self.port) != (other.scheme, other.host, other.port):
            return False
        prefix = self.path.rstrip("/")
        return other.path == prefix or other.path.startswith(prefix + "/")


@functools.lru_cache(maxsize=4096)  # a create checks every record's servers against every allow entry
def normalized_http_url(url: str) -> HttpUrl:
    """``url`` normalized (see the module's docstring); raises ``UrlRefused``."""
    if not url.isascii() or not url.isprintable() or " " in url or "\\" in url:
        raise UrlRefused("has characters that URL parsers read differently (non-ASCII, controls, spaces, "
                         "backslashes)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a bad port, an unclosed [IPv6 address
        raise UrlRefused(f"is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise UrlRefused("is not an http(s) URL")
    if "@" in parts.netloc:
        raise UrlRefused("carries userinfo (user:password@ before the host)")
    host = parts.hostname  # lower-cased by urlsplit
    path = _normalized_path(parts.path)
    netloc = parts.netloc.lower()
    query = f"?{parts.query}" if parts.query else ""
    return HttpUrl(scheme=scheme, host=host, port=_DEFAULT_PORTS[scheme] if port is None else port, path=path,
                   url=f"{scheme}://{netloc}{path}{query}")


def _normalized_path(path: str) -> str:
    if _BAD_ESCAPE.search(path):
        raise UrlRefused("has a malformed percent-escape in its path")
    decoded = _ESCAPE.sub(_decode_unreserved, path)
    segments = _SLASHES.sub("/", decoded or "/").split("/")[1:]
    kept: list[str] = []
    for segment in segments:
        if ";" in segment and segment.split(";", 1)[0] in (".", ".."):
            raise UrlRefused("has a dot segment with parameters (such as ..;) in its path")
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    trailing = "/" if kept and segments[-1] in (".", "..") else ""
    return "/" + "/".join(kept) + trailing


def _decode_unreserved(escape: re.Match[str]) -> str:
    char = chr(int(escape[1], 16))
    if char in _UNRESERVED:
        return char
    if char in "/\\":
        raise UrlRefused("has an encoded slash or backslash (%2F, %5C) in its path")
    return "%" + escape[1].upper()
