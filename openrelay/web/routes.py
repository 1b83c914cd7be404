"""The dashboard's addresses (docs/api-contract.md §9): ``/login``, ``POST /logout``, ``/`` (the Batch page),
``/files``, ``/favicon.ico``, the New batch page of ``new_batch.py`` and the batch pages of ``batch_pages.py``.
Every route parses the request, calls the same service function the API calls, and renders; none decides
anything. None is in the OpenAPI document (they answer HTML)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from ..clock import seconds
from ..config import LIVE_POLL_SECONDS
from ..errors import CsrfRefused, InvalidRequest, Unauthorized
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service import dashboard
from ..service import files as file_service
from ..service import progress as progress_service
from ..service.sessions import SESSION_SECONDS, sign_in, sign_out
from . import batch_pages, new_batch
from .new_batch import UPLOAD_PATHS
from .pages import SignedInSession, dashboard_route, error_page, redirect, render, url_with
from .security import LOGIN_COOKIE, SESSION_COOKIE, csrf_for, csrf_matches, new_login_token, set_cookie
from .static import serve_static, static_url
from .views import BatchView

__all__ = ["mount_dashboard", "UPLOAD_PATHS"]

PAGE_SIZE = 25
FILES_PAGE = 50


def mount_dashboard(app: FastAPI, rt: Runtime, writes: OrgWrites) -> None:
    """The dashboard's pages on ``app``; each page that writes tells ``writes``."""
    router = APIRouter(include_in_schema=False)
    router.add_route("/static/{name}", serve_static, methods=["GET"])
    router.add_route("/favicon.ico", _favicon, methods=["GET"])
    _sign_in_routes(router, rt)
    _list_routes(router, rt)
    new_batch.add_routes(router, rt, writes)
    _file_routes(router, rt, writes)
    batch_pages.add_routes(router, rt, writes)
    for route in router.routes:
        route.include_in_schema = False  # type: ignore[attr-defined]  # HTML pages: not the API's document
    app.include_router(router)


# -- signing in and out ---------------------------------------------------------------------------------------

def _safe_next(value: object) -> str:
    text = value if isinstance(value, str) else "/"
    return text if text.startswith("/") and not text.startswith("//") and "\\" not in text else "/"


def _sign_in_routes(router: APIRouter, rt: Runtime) -> None:
    def login_form(request: Request, status: int = 200, message: str | None = None) -> Response:
        token = new_login_token()
        response = render("login.html", status, signed=None, login_token=token, message=message,
                          next=_safe_next(request.query_params.get("next")))
        set_cookie(response, request, LOGIN_COOKIE, token, max_age=3600)
        return response

    async def login_page(request: Request) -> Response:
        return login_form(request)

    async def login(request: Request) -> Response:
        form = await request.form()
        if not csrf_matches(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
            return login_form(request, 403, "This sign-in form has expired. Paste the key again.")
        api_key = form.get("api_key")
        try:
            if not isinstance(api_key, str) or not api_key.strip():
                raise Unauthorized("Paste an API key to sign in.")
            session_id, _key = await run_in_threadpool(sign_in, rt.accounts, rt.sessions, api_key)
        except Unauthorized as exc:
            return login_form(request, 401, exc.message)
        response = redirect(_safe_next(form.get("next")))
        set_cookie(response, request, SESSION_COOKIE, session_id, max_age=SESSION_SECONDS)
        response.delete_cookie(LOGIN_COOKIE, path="/")
        return response

    async def logout(request: Request) -> Response:
        session_id = request.cookies.get(SESSION_COOKIE) or ""
        form = await request.form()
        if not csrf_matches(csrf_for(session_id), form.get("csrf")) or not session_id:
            return error_page(CsrfRefused("Sign-out refused: the form's CSRF token is missing or wrong."), None)
        await run_in_threadpool(sign_out, rt.sessions, session_id)
        response = redirect("/login")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    router.add_route("/login", login_page, methods=["GET"])
    router.add_route("/login", login, methods=["POST"])
    router.add_route("/logout", logout, methods=["POST"])


# -- the Batch page ---------------------------------------------------------------------------------------------

def _day(value: str | None, *, end: bool = False) -> int | None:
    """A date input (YYYY-MM-DD, UTC) as seconds; ``end``: the end of that day."""
    if not value:
        return None
    try:
        day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise InvalidRequest(f"not a date (YYYY-MM-DD): {value[:40]}", param="from" if not end else "to") from None
    return int(day.timestamp()) + (86_400 if end else 0)


def _batch_query(request: Request) -> dashboard.BatchQuery:
    q = request.query_params
    return dashboard.BatchQuery(
        status=q.get("status") or None, model=q.get("model") or None, priority=q.get("priority") or None,
        tags=tuple(dict.fromkeys(t.strip() for t in q.getlist("tag") if t.strip())), text=q.get("q") or None,
        created_from=_day(q.get("from")), created_to=_day(q.get("to"), end=True))


def _list_routes(router: APIRouter, rt: Runtime) -> None:
    async def batch_page(request: Request, signed: SignedInSession) -> Response:
        query = _batch_query(request)
        after = request.query_params.get("after") or None
        page = await run_in_threadpool(dashboard.list_batch_page, rt.db, signed.key, query, limit=PAGE_SIZE,
                                       after=after)
        numbers = await run_in_threadpool(progress_service.numbers, rt.db, page.batches)
        now = seconds()
        views = [BatchView(b, now, numbers[b.id]) for b in page.batches]
        params = list(request.query_params.multi_items())
        context: dict[str, Any] = dict(
            signed=signed, page=page, rows=views, query=query, params=params, url_with=url_with,
            statuses=dashboard.SHOWN_STATUSES, models=rt.catalog.names(), poll=LIVE_POLL_SECONDS,
            live=any(v.ongoing for v in views), fragment_url=url_with("/", params, fragment="rows"),
            filtered=any([query.status, query.model, query.priority, query.tags, query.text, query.created_from,
                          query.created_to]))
        if request.query_params.get("fragment") == "rows":
            return render("_batch_rows.html", **context)
        return render("batches.html", **context)

    router.add_route("/", dashboard_route(rt)(batch_page), methods=["GET"])


# -- files ----------------------------------------------------------------------------------------------------

def _file_routes(router: APIRouter, rt: Runtime, writes: OrgWrites) -> None:
    async def files_page(request: Request, signed: SignedInSession) -> Response:
        after = request.query_params.get("after") or None
        listed = await run_in_threadpool(file_service.list_files, rt.files, signed.key, limit=FILES_PAGE,
                                         after=after, purpose=None)
        uses = await run_in_threadpool(dashboard.file_uses, rt.files, signed.key, [f["id"] for f in listed["data"]])
        return render("files.html", signed=signed, files=listed["data"], uses=uses, has_more=listed["has_more"],
                      last_id=listed["last_id"])

    async def download(request: Request, signed: SignedInSession, file_id: str) -> Response:
        record, _whole, chunks = await run_in_threadpool(file_service.file_content, rt, signed.key, file_id)
        return StreamingResponse(chunks, media_type="application/octet-stream", headers={
            "content-length": str(record.bytes), "cache-control": "no-store", "x-content-type-options": "nosniff",
            "content-disposition": _attachment(record.filename)})

    async def delete(request: Request, signed: SignedInSession, file_id: str) -> Response:
        await run_in_threadpool(file_service.delete_file, rt.files, rt.blobs, signed.key, file_id)
        return redirect("/files")

    router.add_route("/files", dashboard_route(rt)(files_page), methods=["GET"])
    router.add_route("/files/{file_id}/content", dashboard_route(rt)(download), methods=["GET"])
    router.add_route("/files/{file_id}/delete", dashboard_route(rt, write=writes)(delete), methods=["POST"])


async def _favicon(request: Request) -> Response:
    """Browsers ask for ``/favicon.ico`` whatever a page links: send them to the icon every page links."""
    return RedirectResponse(static_url("favicon.svg"), status_code=301, headers={"cache-control": "max-age=86400"})


def _attachment(filename: str) -> str:
    """A Content-Disposition naming the file safely: ASCII fallback plus the RFC 5987 UTF-8 form."""
    from urllib.parse import quote

    fallback = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in filename)[:120]
    return f"attachment; filename=\"{fallback or 'download'}\"; filename*=UTF-8''{quote(filename[:200])}"
