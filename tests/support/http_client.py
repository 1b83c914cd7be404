"""The tests' own HTTP requests (to servers, the test engine, the webhook receiver), on one client per process.

``httpx.get(...)`` makes a client for each call, and making a client loads the CA store (about 30 ms of CPU; so
does an ``openai.OpenAI``): a test polling every 50 ms spent most of a core on that alone. The shared client
keeps no connection open between requests and no cookies, so each request goes out as ``httpx.get``'s would, on a
connection of its own (nothing carries over to the next, a restarted server's included). ``ssl_context()`` is the
one context for the clients tests make themselves (``openai.DefaultHttpxClient(verify=ssl_context())``).
"""

from __future__ import annotations

import functools
import http.cookiejar
import os
import ssl
import threading
from typing import Any

import httpx

__all__ = ["request", "get", "post", "ssl_context"]


@functools.cache
def ssl_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False  # a response's cookies are not kept for the next request


_lock = threading.Lock()
_clients: dict[int, httpx.Client] = {}  # by process id: a forked child makes its own


def _client() -> httpx.Client:
    with _lock:
        client = _clients.get(os.getpid())
        if client is None:
            client = httpx.Client(verify=ssl_context(), limits=httpx.Limits(max_keepalive_connections=0),
                                  cookies=http.cookiejar.CookieJar(policy=_NoCookies()))
            _clients[os.getpid()] = client
        return client


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """As ``httpx.request``: a request of its own, its answer read whole."""
    return _client().request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)
