"""The dashboard's browser-facing safety: the session cookie, CSRF tokens, and the headers of every page.

A session's CSRF token is derived from its id (an HMAC), so nothing more is stored and a page from another site,
which cannot read the HttpOnly cookie, cannot know it. The sign-in form, which comes before any session, carries
a token that must match a cookie set with the form (a double submit), so no other site can sign a browser in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["SESSION_COOKIE", "LOGIN_COOKIE", "csrf_for", "csrf_matches", "new_login_token", "set_cookie",
           "PAGE_HEADERS", "CSP"]

SESSION_COOKIE = "orl_session"
LOGIN_COOKIE = "orl_login"

# No inline script or style anywhere: scripts and styles come from /static only; nothing is framed or posted
# elsewhere. htmx is configured (base.html) not to inject its indicator styles and never to evaluate code.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")

PAGE_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def csrf_for(session_id: str) -> str:
    return hmac.new(session_id.encode(), b"openrelay dashboard csrf", hashlib.sha256).hexdigest()


def csrf_matches(expected: str | None, given: object) -> bool:
    return bool(expected and isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode()))


def new_login_token() -> str:
    return secrets.token_urlsafe(24)


def set_cookie(response: Response, request: Request, name: str, value: str, *, max_age: int) -> None:
    """HttpOnly, SameSite=Strict, and Secure whenever the page was served over https."""
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
