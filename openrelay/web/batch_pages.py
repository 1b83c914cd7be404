"""The batch detail page (``/batches/{id}``) and what it does: its live part (with, out of band, its actions and
downloads), the record browser, one record's request, cancel, retrying an ended batch's failures and the metadata
editor; opened by a create (``?created=1``), it begins with the create's rejections. Everything is read and
changed through the API's service functions."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..clock import seconds
from ..config import LIVE_POLL_SECONDS
from ..errors import InvalidRequest, OpenRelayError
from ..http.writes import OrgWrites
from ..runtime import Runtime
from ..service import batches as batch_service
from ..service import progress as progress_service
from ..service import records as record_service
from ..service import retry as retry_service
from ..types import Batch, Scope, tag_list
from .pages import SignedInSession, dashboard_route, redirect, render, url_with
from .views import BatchView

__all__ = ["add_routes"]

RECORDS_PAGE = 20
CREATED_REJECTIONS = 20  # rejections shown on the page a create opens; the rest are in the rejections file


def add_routes(router: APIRouter, rt: Runtime, writes: OrgWrites) -> None:
    async def refused(request: Request, signed: SignedInSession, batch_id: str, exc: OpenRelayError) -> Response:
        """The batch's page again, with the refusal of what it was asked to do."""
        batch = await run_in_threadpool(batch_service.get_batch, rt.batches, signed.key, batch_id)
        return await _detail_page(rt, request, signed, batch, status=exc.status, problem=exc.message)

    async def detail(request: Request, signed: SignedInSession, batch_id: str) -> Response:
        batch = await run_in_threadpool(batch_service.get_batch, rt.batches, signed.key, batch_id)
        progress = (await run_in_threadpool(progress_service.numbers, rt.db, [batch]))[batch.id]
        view = BatchView(batch, seconds(), progress)
        if request.query_params.get("fragment") == "live":
            # The live card, and out of band the parts that change with it: the actions and the downloads.
            return render("_batch_live_fragment.html", signed=signed, b=view, poll=LIVE_POLL_SECONDS, oob=True)
        return await _detail_page(rt, request, signed, batch)

    async def request_of(request: Request, signed: SignedInSession, batch_id: str) -> Response:
        custom_id = request.query_params.get("custom_id") or ""
        found = await run_in_threadpool(record_service.find_request, rt.batches, rt.blobs, signed.key, batch_id,
                                        custom_id)
        return render("_request.html", signed=signed, record=found, custom_id=custom_id)

    async def cancel(request: Request, signed: SignedInSession, batch_id: str) -> Response:
        try:
            await run_in_threadpool(batch_service.cancel_batch, rt.batches, signed.key, batch_id)
        except OpenRelayError as exc:
            if exc.status != 409:
                raise
            return await refused(request, signed, batch_id, exc)
        return redirect(f"/batches/{batch_id}")

    async def metadata(request: Request, signed: SignedInSession, batch_id: str) -> Response:
        form = await request.form()
        try:
            wanted = _metadata_from_editor(form)
            await run_in_threadpool(batch_service.replace_metadata, rt.batches, signed.key, batch_id,
                                    orjson.dumps({"metadata": wanted}))
        except InvalidRequest as exc:
            return await refused(request, signed, batch_id, exc)
        return redirect(f"/batches/{batch_id}#metadata")

    async def retry(request: Request, signed: SignedInSession, batch_id: str) -> Response:
        try:
            made = await run_in_threadpool(retry_service.retry_batch, rt, signed.key, batch_id, b"")
        except OpenRelayError as exc:
            if exc.status not in (400, 402, 409, 413):
                raise
            return await refused(request, signed, batch_id, exc)
        return redirect(f"/batches/{orjson.loads(made)['id']}")

    router.add_route("/batches/{batch_id}", dashboard_route(rt)(detail), methods=["GET"])
    router.add_route("/batches/{batch_id}/retry", dashboard_route(rt, write=writes)(retry), methods=["POST"])
    router.add_route("/batches/{batch_id}/request", dashboard_route(rt)(request_of), methods=["GET"])
    router.add_route("/batches/{batch_id}/cancel", dashboard_route(rt, write=writes)(cancel), methods=["POST"])
    router.add_route("/batches/{batch_id}/metadata", dashboard_route(rt, write=writes)(metadata),
                         methods=["POST"])


def _metadata_from_editor(form: Any) -> dict[str, str]:
    """The editor's form as the whole desired map: its key/value rows, and its tags (the current ones less any
    whose chip's remove button was pressed, plus the ones typed in)."""
    wanted: dict[str, str] = {}
    names, values = form.getlist("meta_key"), form.getlist("meta_value")
    for name, value in zip(names, values, strict=False):
        if isinstance(name, str) and name.strip() and name.strip() != "tags":
            wanted[name.strip()] = value if isinstance(value, str) else ""
    removed = set(form.getlist("remove_tag"))
    current = [t for t in tag_list({"tags": str(form.get("tags") or "")}) if t not in removed]
    added = tag_list({"tags": str(form.get("add_tags") or "")})
    tags = list(dict.fromkeys(current + added))
    if tags:
        wanted["tags"] = ",".join(tags)
    return wanted


async def _detail_page(rt: Runtime, request: Request, signed: SignedInSession, batch: Batch, *, status: int = 200,
                       problem: str | None = None) -> Response:
    q = request.query_params
    progress = (await run_in_threadpool(progress_service.numbers, rt.db, [batch]))[batch.id]
    view = BatchView(batch, seconds(), progress)
    kind = q.get("kind") or "all"
    filters = {"code": q.get("code") or None, "custom_id": q.get("cid") or None, "cursor": q.get("at") or None}
    browse = {"kind": kind, **filters}
    records = summary = None
    if signed.can(Scope.FILES_READ):
        records = await run_in_threadpool(lambda: record_service.browse_records(
            rt, signed.key, batch.id, limit=RECORDS_PAGE, kind=kind, **filters))
        summary = await run_in_threadpool(record_service.error_summary, rt, signed.key, batch)
    series = await run_in_threadpool(record_service.throughput, rt.results, signed.key, batch)
    peak = max((s["records"] for s in series), default=0)
    created = None
    if q.get("created"):  # the create's redirect: what it said, rejections first
        rejected = await run_in_threadpool(lambda: record_service.create_rejections(
            rt, signed.key, batch, limit=CREATED_REJECTIONS)) if signed.can(Scope.FILES_READ) else None
        created = {"rejected": rejected}
    params = list(q.multi_items())
    return render("batch.html", status, signed=signed, b=view, poll=LIVE_POLL_SECONDS, problem=problem,
                  records=records, browse=browse, error_summary=summary, series=series, peak=peak,
                  params=params, url_with=url_with, kinds=record_service.RECORD_KINDS, created=created)
