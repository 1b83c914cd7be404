"""The New batch page (``/new``): the upload, the endpoint its records name (``/new/endpoint``, drawn again when
another file is picked), and the create, which answers a redirect to the new batch's page (a 303: a reload of
that page reads it, it does not create again). The create is the API's service function; an estimate (a dry run)
and a refusal are drawn on this page."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..errors import InvalidRequest, NotFound, NoValidRecords, OpenRelayError
from ..http.uploads import receive_upload
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service import batches as batch_service
from ..service import dashboard
from ..service import files as file_service
from ..service.endpoint_guess import EndpointGuess, guess_endpoint
from ..types import Scope
from .pages import SignedInSession, dashboard_route, redirect, render, require_csrf, url_with

__all__ = ["add_routes", "UPLOAD_PATHS"]

UPLOAD_PATHS = ("/new/upload",)  # the routes that stream an upload (http/uploads.py), held to its limit, not 1 MB
PICKER_FILES = 100  # the newest uploads the file picker offers


def add_routes(router: APIRouter, rt: Runtime, writes: OrgWrites) -> None:
    async def new_page(request: Request, signed: SignedInSession) -> Response:
        return await _render_new(rt, request, signed)

    async def endpoint_field(request: Request, signed: SignedInSession) -> Response:
        """The endpoint field and the picked file's facts, for the file the picker now names."""
        file_id = request.query_params.get("input_file_id") or None
        options = await run_in_threadpool(dashboard.create_options, rt.accounts, rt.catalog, signed.key)
        guess, picked = await _picked_file(rt, signed, file_id)
        return render("_endpoint_field.html", signed=signed, options=options, guess=guess, picked=picked,
                      selected=guess.chosen if guess else None)

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
            threshold = _threshold_from_form(form.get("error_rate"), form.get("min_records"))
            if threshold is not None:
                body["failure_threshold"] = threshold
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
        return redirect(url_with(f"/batches/{created['id']}", [], created="1"))

    router.add_route("/new", dashboard_route(rt)(new_page), methods=["GET"])
    router.add_route("/new/endpoint", dashboard_route(rt)(endpoint_field), methods=["GET"])
    router.add_route(UPLOAD_PATHS[0], dashboard_route(rt, write=writes, streamed=True)(upload), methods=["POST"])
    router.add_route("/new", dashboard_route(rt, write=writes)(create), methods=["POST"])


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


def _threshold_from_form(rate: object, after: object) -> dict[str, Any] | None:
    """The "stop early" fields as the create's ``failure_threshold`` (which the create checks); both empty: none."""
    rate_text, after_text = (str(v or "").strip() for v in (rate, after))
    if not rate_text and not after_text:
        return None
    return {"error_rate": _number(rate_text, float), "min_records": _number(after_text, int)}


def _number(text: str, kind: type[float] | type[int]) -> Any:
    try:
        return kind(text)
    except ValueError:
        return text  # the create refuses it, naming the field


async def _picked_file(rt: Runtime, signed: SignedInSession,
                       file_id: str | None) -> tuple[EndpointGuess | None, dict[str, Any] | None]:
    """The endpoint the picked file's records name, and the file with the batches made from it; (None, None)
    for no file, or one this key cannot read."""
    if not file_id or not signed.can(Scope.FILES_READ):
        return None, None
    try:
        guess = await run_in_threadpool(guess_endpoint, rt, signed.key, file_id)
        record = await run_in_threadpool(file_service.get_file, rt, signed.key, file_id)
    except NotFound:
        return None, None
    uses = await run_in_threadpool(dashboard.file_uses, rt.files, signed.key, [file_id])
    return guess, {**record.as_api(), "uses": uses.get(file_id)}


async def _render_new(rt: Runtime, request: Request, signed: SignedInSession, *, status: int = 200,
                      refused: NoValidRecords | None = None, failed: OpenRelayError | None = None,
                      form: Any = None, estimate: dict[str, Any] | None = None) -> Response:
    options = await run_in_threadpool(dashboard.create_options, rt.accounts, rt.catalog, signed.key)
    files: list[dict[str, Any]] = []
    uses: dict[str, dashboard.FileUses] = {}
    if signed.can(Scope.FILES_READ):
        listed = await run_in_threadpool(file_service.list_files, rt.files, signed.key, limit=PICKER_FILES,
                                         after=None, purpose="batch")
        files = listed["data"]
        uses = await run_in_threadpool(dashboard.file_uses, rt.files, signed.key, [f["id"] for f in files])
    chosen = (form.get("input_file_id") if form is not None else None) or request.query_params.get("input_file_id")
    guess, picked = await _picked_file(rt, signed, chosen)
    sent = form.get("endpoint") if form is not None else None  # a refused create keeps the endpoint it sent
    return render("new.html", status, signed=signed, options=options, files=files, uses=uses, chosen=chosen,
                  guess=guess, picked=picked, selected=sent or (guess.chosen if guess else None),
                  idempotency_key=str(uuid.uuid4()), refused=refused, failed=failed, form=form or {},
                  estimate=estimate)
