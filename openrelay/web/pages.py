"""What every dashboard route shares: the signed-in key, rendering with the safety headers, errors as pages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..clock import seconds
from ..errors import CsrfRefused, OpenRelayError, Unauthorized
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service.sessions import session_key
from ..types import ApiKey, Scope
from .security import PAGE_HEADERS, SESSION_COOKIE, csrf_for, csrf_matches
from .static import static_url
from .views import templates

__all__ = ["SignedInSession", "render", "dashboard_route", "redirect", "url_with"]


@dataclass(frozen=True)
class SignedInSession:
    """The key a request acts as, through its session, and the session's CSRF token."""

    key: ApiKey
    csrf: str

    def can(self, scope: str) -> bool:
        return scope in self.key.scopes

    @property
    def scopes(self) -> dict[str, bool]:
        return {s.value.replace(".", "_"): s.value in self.key.scopes for s in Scope}


def render(name: str, status: int = 200, headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
    context.setdefault("now", seconds())
    html = templates.get_template(name).render(static_url=static_url, **context)
    return HTMLResponse(html, status_code=status, headers={**PAGE_HEADERS, **(headers or {})})


def redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=303, headers=PAGE_HEADERS)


def url_with(path: str, params: list[tuple[str, str]], **changes: str | None) -> str:
    """``path`` with the query ``params`` where each of ``changes`` replaces (or, when None, removes) its name."""
    kept = [(k, v) for k, v in params if k not in changes and v != ""]
    kept += [(k, v) for k, v in changes.items() if v is not None]
    return path + ("?" + urlencode(kept) if kept else "")


Handler = Callable[..., Awaitable[Response]]


def require_csrf(signed: SignedInSession, given: object) -> None:
    if not csrf_matches(signed.csrf, given):
        raise CsrfRefused("This form has expired or did not come from this dashboard (its CSRF token is missing or "
                          "wrong). Reload the page and try again.")


def dashboard_route(rt: Runtime, *, write: OrgWrites | None = None,
                    streamed: bool = False) -> Callable[[Handler], Callable[..., Awaitable[Response]]]:
    """A page that needs a session: ``handler(request, signed, **path)``. A POST that writes (``write``, the
    process's write hook, told once the handler ran) must carry the session's CSRF token; a ``streamed`` one (an
    upload, read as a stream) checks it itself with ``require_csrf`` before it keeps anything. The service's
    refusals become pages: 401 sends the browser to sign in, 404 is the same page for another organization's id as
    for an unknown one."""

    def wrap(handler: Handler) -> Callable[..., Awaitable[Response]]:
        async def route(request: Request) -> Response:
            session_id = request.cookies.get(SESSION_COOKIE)
            signed: SignedInSession | None = None
            try:
                key = await run_in_threadpool(session_key, rt.accounts, rt.sessions, session_id)
                signed = SignedInSession(key=key, csrf=csrf_for(session_id or ""))
                if write is not None and not streamed:
                    require_csrf(signed, (await request.form()).get("csrf"))
                try:
                    return await handler(request, signed, **request.path_params)
                finally:
                    if write is not None:  # the API's polls of this process see the write at once
                        write.wrote(key.org_id)
            except Unauthorized:
                if request.method == "GET" and not request.headers.get("hx-request"):
                    return redirect(url_with("/login", [], next=_same_site_path(request)))
                return render("error.html", 401, headers={"hx-redirect": "/login"}, signed=None,
                              title="Signed out", message="Your session has ended. Sign in again.")
            except OpenRelayError as exc:
                return error_page(exc, signed=signed)

        return route

    return wrap


def error_page(exc: OpenRelayError, signed: SignedInSession | None) -> HTMLResponse:
    titles = {400: "Refused", 403: "Not allowed", 404: "Not found", 409: "Conflict", 402: "Over budget"}
    message = exc.message if exc.status != 404 else "There is no such batch or file in your organization."
    return render("error.html", exc.status, signed=signed, title=titles.get(exc.status, "Error"),
                  message=message if exc.status < 500 else exc.envelope()["error"]["message"], code=exc.code)


def _same_site_path(request: Request) -> str:
    path = request.url.path
    if request.url.query:
        path += "?" + request.url.query
    return path if path.startswith("/") and not path.startswith("//") else "/"
