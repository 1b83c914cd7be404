"""The dashboard's addresses (docs/api-contract.md §9): ``/login``, ``POST /logout``, ``/`` (the Batch page), ``/new``,
``/files``, and the batch pages of ``batch_pages.py``. Every route parses the request, calls the same service
function the API calls, and renders; none decides anything. None is in the OpenAPI document (they answer HTML)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..config import LIVE_POLL_SECONDS
from ..errors import CsrfRefused, InvalidRequest, NoValidRecords, OpenRelayError, Unauthorized
from ..http.uploads import receive_upload
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service import batches as batch_service
from ..service import dashboard
from ..service import files as file_service
from ..service import progress as progress_service
from ..service.sessions import SESSION_SECONDS, sign_in, sign_out
from ..types import Scope
from . import batch_pages
from .pages import SignedInSession, dashboard_route, error_page, redirect, render, require_csrf, url_with
from .security import LOGIN_COOKIE, SESSION_COOKIE, csrf_for, csrf_matches, new_login_token, set_cookie
from .static import serve_static
from .views import BatchView

__all__ = ["mount_dashboard", "UPLOAD_PATHS"]

PAGE_SIZE = 25
UPLOAD_PATHS = ("/new/upload",)  # the routes that stream an upload (http/uploads.py), held to its limit, not 1 MB


def mount_dashboard(app: FastAPI, rt: Runtime, writes: OrgWrites) -> None:
    """The dashboard's pages on ``app``; each page that writes tells ``writes``."""
    router = APIRouter(include_in_schema=False)
    router.add_route("/static/{name}", serve_static, methods=["GET"])
    _sign_in_routes(router, rt)
    _list_routes(router, rt)
    _new_routes(router, rt, writes)
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
        numbers = await run_in_threadpool(progress_service.numbers_of, rt.db, page.batches)
        now = time.time()
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


# -- new batch ------------------------------------------------------------------------------------------------

def _metadata_from_form(text: object, tags: object) -> dict[str, str] | None:
    """``key=value`` lines and a comma-separated tags field, as the metadata map the API takes."""
    metadata: dict[str, str] = {}
    for line in (text if isinstance(text, str) else "").splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise InvalidRequest(f"metadata lines are key=value: {line[:80]!r}", param="metadata")
        metadata[name.strip()] = value.strip()
    tag_text = ",".join(t.strip() for t in (tags if isinstance(tags, str) else "").split(",") if t.strip())
    if tag_text:
        metadata["tags"] = tag_text
    return metadata or None


def _new_routes(router: APIRouter, rt: Runtime, writes: OrgWrites) -> None:
    async def new_page(request: Request, signed: SignedInSession) -> Response:
        return await _render_new(rt, request, signed)

    async def upload(request: Request, signed: SignedInSession) -> Response:
        # The API's upload path: streamed into the blob store, kept only when the form is whole and its CSRF
        # token right, the same size limit.
        record = await receive_upload(rt, signed.key, request, purpose="batch",
                                      check_fields=lambda fields: require_csrf(signed, fields.get("csrf")))
        return redirect(url_with("/new", [], input_file_id=record.id))

    async def create(request: Request, signed: SignedInSession) -> Response:
        form = await request.form()
        body: dict[str, Any] = {"input_file_id": form.get("input_file_id") or "",
                                "endpoint": form.get("endpoint") or "", "completion_window": "24h",
                                "priority": form.get("priority") or "standard"}
        dry_run = bool(form.get("dry_run"))  # the "Estimate" button: checks and prices, creates nothing
        if dry_run:
            body["dry_run"] = True
        try:
            metadata = _metadata_from_form(form.get("metadata"), form.get("tags"))
            if metadata:
                body["metadata"] = metadata
            answer = await run_in_threadpool(batch_service.create_batch, rt, signed.key, orjson.dumps(body),
                                             str(form.get("idempotency_key") or "") or None)
        except NoValidRecords as exc:
            return await _render_new(rt, request, signed, status=400, refused=exc, form=form)
        except OpenRelayError as exc:
            if exc.status in (401, 403):
                raise
            return await _render_new(rt, request, signed, status=exc.status, failed=exc, form=form)
        created = orjson.loads(answer)
        if dry_run:
            return await _render_new(rt, request, signed, estimate=created, form=form)
        return render("created.html", signed=signed, batch=created,
                      rejected=created.get("rejected_records") or [])

    router.add_route("/new", dashboard_route(rt)(new_page), methods=["GET"])
    router.add_route(UPLOAD_PATHS[0], dashboard_route(rt, write=writes, streamed=True)(upload), methods=["POST"])
    router.add_route("/new", dashboard_route(rt, write=writes)(create), methods=["POST"])


async def _render_new(rt: Runtime, request: Request, signed: SignedInSession, *, status: int = 200,
                      refused: NoValidRecords | None = None, failed: OpenRelayError | None = None,
                      form: Any = None, estimate: dict[str, Any] | None = None) -> Response:
    options = await run_in_threadpool(dashboard.create_options, rt.accounts, rt.catalog, signed.key)
    files: list[dict[str, Any]] = []
    if signed.can(Scope.FILES_READ):
        listed = await run_in_threadpool(file_service.list_files, rt.files, signed.key, limit=100, after=None,
                                         purpose="batch")
        files = listed["data"]
    chosen = (form.get("input_file_id") if form is not None else None) or request.query_params.get("input_file_id")
    return render("new.html", status, signed=signed, options=options, files=files, chosen=chosen,
                  idempotency_key=str(uuid.uuid4()), refused=refused, failed=failed,
                  form=form or {}, estimate=estimate)


# -- files ----------------------------------------------------------------------------------------------------

def _file_routes(router: APIRouter, rt: Runtime, writes: OrgWrites) -> None:
    async def files_page(request: Request, signed: SignedInSession) -> Response:
        after = request.query_params.get("after") or None
        listed = await run_in_threadpool(file_service.list_files, rt.files, signed.key, limit=50, after=after,
                                         purpose=None)
        return render("files.html", signed=signed, files=listed["data"], has_more=listed["has_more"],
                      last_id=listed["last_id"])

    async def download(request: Request, signed: SignedInSession, file_id: str) -> Response:
        record, chunks = await run_in_threadpool(file_service.file_content, rt, signed.key, file_id)
        return StreamingResponse(chunks, media_type="application/octet-stream", headers={
            "content-length": str(record.bytes), "cache-control": "no-store", "x-content-type-options": "nosniff",
            "content-disposition": _attachment(record.filename)})

    async def delete(request: Request, signed: SignedInSession, file_id: str) -> Response:
        await run_in_threadpool(file_service.delete_file, rt.files, rt.blobs, signed.key, file_id)
        return redirect("/files")

    router.add_route("/files", dashboard_route(rt)(files_page), methods=["GET"])
    router.add_route("/files/{file_id}/content", dashboard_route(rt)(download), methods=["GET"])
    router.add_route("/files/{file_id}/delete", dashboard_route(rt, write=writes)(delete), methods=["POST"])


def _attachment(filename: str) -> str:
    """A Content-Disposition naming the file safely: ASCII fallback plus the RFC 5987 UTF-8 form."""
    from urllib.parse import quote

    fallback = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in filename)[:120]
    return f"attachment; filename=\"{fallback or 'download'}\"; filename*=UTF-8''{quote(filename[:200])}"
