"""Files: uploads streamed into the blob store, listing, download and delete."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from ..blobs.base import BlobStore, BlobWriter, iter_bytes
from ..blobs.keys import file_key
from ..errors import InvalidRequest, PayloadTooLarge, RangeNotSatisfiable
from ..ids import new_file_id
from ..runtime import Runtime
from ..store.files import Files
from ..types import ApiKey, FileRecord, Scope
from .auth import require
from .bodies import list_page
from .expiry import upload_expiry
from .partial_results import PartialFile, parse_result_file_id, partial_file, read_partial

__all__ = ["Upload", "list_files", "get_file", "file_content", "delete_file", "upload_too_large", "PURPOSES"]

PURPOSES = ("batch",)
MAX_FILENAME = 512


def upload_too_large(max_upload_bytes: int) -> PayloadTooLarge:
    """The refusal of an upload over ``max_upload_bytes``, whether its declared length or its bytes say so."""
    return PayloadTooLarge(f"file is larger than the {max_upload_bytes // 1_000_000} MB limit", param="file")


class Upload:
    """One upload in progress: bytes go straight to the blob store, never whole into memory."""

    def __init__(self, rt: Runtime, key: ApiKey) -> None:
        require(key, Scope.FILES_WRITE)
        self.rt = rt
        self.key = key
        self.file_id = new_file_id()
        self.blob_key = file_key(self.file_id)
        self.size = 0
        self._writer_cm: AbstractContextManager[BlobWriter] | None = rt.blobs.writer(self.blob_key)
        self._writer = self._writer_cm.__enter__()

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.rt.settings.http.max_upload_bytes:
            self.abort()
            raise upload_too_large(self.rt.settings.http.max_upload_bytes)
        self._writer.write(data)

    def abort(self) -> None:
        if self._writer_cm is not None:
            self._writer_cm.__exit__(InvalidRequest, InvalidRequest("aborted"), None)
            self._writer_cm = None

    def finish(self, *, filename: str, purpose: str | None, fields: dict[str, str] | None = None) -> FileRecord:
        """Keep the file; ``fields``: the form's text fields (its ``expires_after``)."""
        try:
            expires_after = upload_expiry(fields or {}, min_seconds=self.rt.settings.retention.min_expiry_seconds)
        except InvalidRequest:
            self.abort()
            raise
        if purpose not in PURPOSES:
            self.abort()
            raise InvalidRequest(f"purpose must be one of: {', '.join(PURPOSES)}", param="purpose")
        if len(filename) > MAX_FILENAME or "\x00" in filename:
            # The store keeps names of up to 512 characters, and PostgreSQL no NUL in any text.
            self.abort()
            raise InvalidRequest(f"the file name must be at most {MAX_FILENAME} characters, without NUL",
                                 param="file")
        assert self._writer_cm is not None
        self._writer_cm.__exit__(None, None, None)
        self._writer_cm = None
        return self.rt.files.add(file_id=self.file_id, org_id=self.key.org_id, purpose=purpose,
                                 filename=filename or "upload.jsonl", size=self.size, blob_key=self.blob_key,
                                 expires_after=expires_after)


def list_files(files: Files, key: ApiKey, *, limit: int, after: str | None, purpose: str | None,
               order: str = "desc") -> dict:
    require(key, Scope.FILES_READ)
    if not 1 <= limit <= 10_000:
        raise InvalidRequest("limit must be between 1 and 10000", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest(f'order must be "asc" (oldest first) or "desc" (newest first); got {order!r}',
                             param="order")
    found, more = files.list(key.org_id, limit=limit, after=after, purpose=purpose, oldest_first=order == "asc")
    return list_page([f.as_api() for f in found], more)


def get_file(rt: Runtime, key: ApiKey, file_id: str) -> FileRecord:
    """A file; a result file of a batch still running is a ``PartialFile`` (service/partial_results.py)."""
    require(key, Scope.FILES_READ)
    if parse_result_file_id(file_id) is not None:
        return partial_file(rt, key.org_id, file_id)
    return rt.files.get(key.org_id, file_id)


def file_content(rt: Runtime, key: ApiKey, file_id: str, span: Callable[[int], tuple[int, int] | None] | None = None,
                 ) -> tuple[FileRecord, tuple[int, int] | None, Iterator[bytes]]:
    """The file, the bytes (start, stop) of it that ``span`` picks for its size (None: all of them), and those
    bytes. ``span`` answering None is ``RangeNotSatisfiable``."""
    record = get_file(rt, key, file_id)
    part = None if span is None else span(record.bytes)
    if span is not None and part is None:
        raise RangeNotSatisfiable(f"the file has {record.bytes} bytes; none of them is in the range asked for",
                                  headers=(("content-range", f"bytes */{record.bytes}"),))
    start, stop = part or (0, record.bytes)
    if isinstance(record, PartialFile):
        return record, part, _cut(read_partial(rt.blobs, record, start), stop - start)
    rt.blobs.size(record.blob_key)  # a missing blob fails here, before a response has started
    return record, part, _cut(iter_bytes(rt.blobs, record.blob_key, start), stop - start)


def _cut(pieces: Iterator[bytes], length: int) -> Iterator[bytes]:
    """The first ``length`` bytes of ``pieces`` (a generator left early is closed as it goes, its blob with it)."""
    for piece in pieces:
        if len(piece) >= length:
            yield piece[:length]
            return
        length -= len(piece)
        yield piece


def delete_file(files: Files, blobs: BlobStore, key: ApiKey, file_id: str) -> dict:
    require(key, Scope.FILES_WRITE)
    record, blob_free = files.delete(key.org_id, file_id)
    if blob_free:
        blobs.delete(record.blob_key)
    return {"id": record.id, "object": "file", "deleted": True}
