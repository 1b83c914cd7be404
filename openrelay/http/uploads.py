"""Receiving an uploaded file from an HTTP request: the one path every upload takes (the API's ``POST /v1/files``
and the dashboard's upload form), so the size limit, the whole-form rule and the clean-up on refusal hold alike."""

from __future__ import annotations

from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ..errors import InvalidRequest
from ..runtime import Runtime
from ..service import files as file_service
from ..types import ApiKey, FileRecord
from .multipart import stream_form

__all__ = ["receive_upload", "UPLOAD_FORM_SLACK"]

UPLOAD_FORM_SLACK = 64 * 1024  # the form's own bytes (boundaries, part headers, fields) beside the file


async def receive_upload(rt: Runtime, key: ApiKey, request: Request, *,
                         check_fields: Callable[[dict[str, str]], None] | None = None,
                         purpose: str | None = None) -> FileRecord:
    """Stream the form's ``file`` part into a new file and store it once the form proved whole. ``check_fields``
    may refuse the form by its text fields (raising), after the bytes arrived and before anything is kept;
    ``purpose`` overrides the form's own field."""
    declared = int(request.headers.get("content-length") or 0)
    if declared > rt.settings.http.max_upload_bytes + UPLOAD_FORM_SLACK:
        raise file_service.upload_too_large(rt.settings.http.max_upload_bytes)
    upload = await run_in_threadpool(file_service.Upload, rt, key)  # every blob store call off the event loop

    async def sink(data: bytes) -> None:
        await run_in_threadpool(upload.write, data)

    try:
        fields, filename = await stream_form(request.headers.get("content-type"), request.stream(), sink)
        if check_fields is not None:
            check_fields(fields)
        if filename is None:
            raise InvalidRequest("the form has no 'file' part", param="file")
    except Exception:
        await run_in_threadpool(upload.abort)
        raise
    except BaseException:  # cancelled (the client went away): abort here, without awaiting
        upload.abort()
        raise
    return await run_in_threadpool(upload.finish, filename=filename, purpose=purpose or fields.get("purpose"),
                                   fields=fields)
