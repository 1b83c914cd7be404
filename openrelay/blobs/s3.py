"""Blobs as objects in an S3-compatible bucket (AWS S3, R2, GCS's S3 API, SeaweedFS, MinIO, Ceph), through obstore.

- A writer buffers one part (``part_bytes``) at a time: a blob that outgrows it becomes a multipart upload whose
  parts go out as they fill, so an upload of any size holds at most ``part_bytes * max_concurrency`` in memory
  and nothing on local disk. The object appears when the writer exits cleanly (the multipart upload is completed,
  or a small blob is put whole); an exception aborts the upload, so a blob is whole or absent.
- A reader fetches ``read_bytes`` windows by range, each one checked against the object's ETag at open: a blob
  rewritten while it is read (a finalize run again) fails the read instead of mixing two versions.
- ``compose`` streams each source through a new writer (obstore has no UploadPartCopy), so memory stays bounded by
  the writer's parts, whatever the sizes of the sources.
- Driver errors (obstore's, and the OS errors under them) become ``StoreError`` here, ``StoreUnavailable`` (503)
  when the server could not be reached or answered 5xx; absent keys ``BlobMissing``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.exceptions import NotFoundError
from obstore.store import S3Store

from ..errors import ConfigError, StoreError, StoreUnavailable
from .base import BlobMissing
from .keys import check_key

__all__ = ["S3BlobStore", "S3Location"]

_DRIVER_ERRORS = (ObstoreError, OSError)
_MISSING = (NotFoundError, FileNotFoundError)
# A request that never got an answer (refused, reset, timed out) or got a 5xx once retries ran out.
_UNREACHABLE = ("HTTP error: error sending request", "kind: Connect", "kind: Timeout", "kind: Interrupted",
                "kind: Request", "Server returned non-2xx status code: 5", "status: 5")


@dataclass(frozen=True, kw_only=True)
class S3Location:
    """``s3://BUCKET/PREFIX`` taken apart; the prefix has no leading or trailing ``/`` and may be empty."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ConfigError(f"--blob-url {url!r}: expected s3://BUCKET/PREFIX")
        prefix = parts.path.strip("/")
        if prefix:
            try:
                check_key(prefix)
            except ValueError:
                raise ConfigError(f"--blob-url {url!r}: the prefix has an empty, '.' or '..' part") from None
        return cls(bucket=parts.netloc, prefix=prefix)


class S3BlobStore:
    def __init__(self, location: S3Location, *, endpoint: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 part_bytes: int = 8 << 20, max_concurrency: int = 4, read_bytes: int = 8 << 20) -> None:
        if part_bytes < 5 << 20:
            raise ConfigError("S3 multipart parts must be at least 5 MiB (every part but the last)")
        self.location = location
        self.part_bytes = part_bytes
        self.max_concurrency = max_concurrency
        self.read_bytes = read_bytes
        config: dict[str, Any] = {"region": region or "us-east-1"}
        if endpoint:
            # SeaweedFS, MinIO and Ceph serve buckets under the path, not as a host name.
            config.update(endpoint=endpoint, virtual_hosted_style_request=False)
        if access_key_id and secret_access_key:
            config.update(access_key_id=access_key_id, secret_access_key=secret_access_key)
        try:
            self._store = S3Store(
                location.bucket, prefix=location.prefix or None, config=config,  # type: ignore[arg-type]
                client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                                "connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=60)},
                # A store that is away fails a call within seconds; the worker retries result writes itself.
                retry_config={"max_retries": 3, "retry_timeout": timedelta(seconds=10),
                              "backoff": {"init_backoff": timedelta(milliseconds=100),
                                          "max_backoff": timedelta(seconds=2), "base": 2}},
            )
        except _DRIVER_ERRORS as exc:
            raise ConfigError(f"--blob-url s3://{location.bucket}: {_brief(exc)}") from exc

    @classmethod
    def from_environment(cls, url: str, environ: Mapping[str, str]) -> S3BlobStore:
        """The store at ``url`` with the endpoint, region and credentials of the standard AWS variables."""
        return cls(S3Location.parse(url), endpoint=environ.get("AWS_ENDPOINT_URL") or None,
                   region=environ.get("AWS_REGION") or None,
                   access_key_id=environ.get("AWS_ACCESS_KEY_ID") or None,
                   secret_access_key=environ.get("AWS_SECRET_ACCESS_KEY") or None)

    def check_reachable(self) -> None:
        """List one key under the prefix: a bucket that is missing, refused or away fails here, when the process
        starts, rather than in the first upload."""
        try:
            next(iter(obstore.list(self._store, chunk_size=1)), None)
        except _DRIVER_ERRORS as exc:
            raise ConfigError(f"--blob-url s3://{self.location.bucket}/{self.location.prefix}: the bucket cannot "
                              f"be listed: {_brief(exc)}") from exc

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[_PartWriter]:
        path = _path(key)
        try:
            upload = obstore.open_writer(self._store, path, buffer_size=self.part_bytes,
                                         max_concurrency=self.max_concurrency)
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot write blob {key!r}", exc) from exc
        try:
            yield _PartWriter(upload, key)
        except BaseException as exc:
            # WritableFile aborts the multipart upload (or drops its buffer) when it exits with an exception.
            with contextlib.suppress(*_DRIVER_ERRORS):
                upload.__exit__(type(exc), exc, exc.__traceback__)
            raise
        try:
            upload.close()
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot write blob {key!r}", exc) from exc

    @contextlib.contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        meta = self._head(key)
        raw = _RangeReader(self._store, key, size=meta["size"], e_tag=meta["e_tag"], window=self.read_bytes)
        with io.BufferedReader(raw, 1 << 20) as handle:
            yield handle

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        asked = [(start, length) for start, length in ranges if length > 0]  # S3 has no empty range
        if not asked:
            self._head(key)  # absent is BlobMissing, as for any other read
            return [b"" for _ in ranges]
        try:
            found = obstore.get_ranges(self._store, _path(key), starts=[start for start, _ in asked],
                                       lengths=[length for _, length in asked])
        except _MISSING as exc:
            raise BlobMissing(f"blob {key!r} is missing") from exc
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot read blob {key!r}", exc) from exc
        parts = iter(found)
        return [bytes(next(parts)) if length > 0 else b"" for _, length in ranges]

    def compose(self, key: str, sources: Iterable[str]) -> int:
        size = 0
        with self.writer(key) as out:
            for source in sources:
                with self.open(source) as handle:
                    while chunk := handle.read(1 << 20):
                        size += out.write(chunk)
        return size

    def size(self, key: str) -> int:
        return self._head(key)["size"]

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except BlobMissing:
            return False
        return True

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._store, _path(key))  # an absent key is no error to S3
        except _MISSING:
            return
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot delete blob {key!r}", exc) from exc

    def delete_folder(self, folder: str) -> None:
        # Listed a page at a time and deleted in one request per page (S3's DeleteObjects takes up to 1,000 keys).
        # An unfinished multipart upload holds no object to list; the bucket's lifecycle rule for incomplete
        # uploads (docs/deploy.md) removes those.
        try:
            for page in obstore.list(self._store, prefix=_path(folder) + "/", chunk_size=1000):
                obstore.delete(self._store, [meta["path"] for meta in page])
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot delete blobs under {folder!r}", exc) from exc

    def _head(self, key: str) -> Any:
        try:
            return obstore.head(self._store, _path(key))
        except _MISSING as exc:
            raise BlobMissing(f"blob {key!r} is missing") from exc
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot read blob {key!r}", exc) from exc


def _failure(what: str, exc: BaseException) -> StoreError:
    """``what`` failed because of ``exc``: ``StoreUnavailable`` when the server could not be reached or answered
    5xx (after obstore's own retries; worth trying again later), else ``StoreError``. obstore raises both kinds
    as ``GenericError`` (``OSError`` from a writer), so its debug text is what tells them apart."""
    text = str(exc)
    message = f"{what}: {_brief(exc)}"
    if any(mark in text for mark in _UNREACHABLE):
        return StoreUnavailable(message)
    return StoreError(message)


def _brief(exc: BaseException) -> str:
    """The driver's message without the debug dump obstore appends to it."""
    return str(exc).split("\n\nDebug source:", 1)[0].strip()


def _path(key: str) -> str:
    try:
        return check_key(key)
    except ValueError as exc:
        raise StoreError(str(exc)) from None


class _PartWriter:
    """What ``writer`` yields: obstore's buffered writer, with its errors translated."""

    def __init__(self, upload: Any, key: str) -> None:
        self._upload = upload
        self._key = key

    def write(self, data: bytes) -> int:
        try:
            return self._upload.write(data)
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot write blob {self._key!r}", exc) from exc


class _RangeReader(io.RawIOBase):
    """A seekable raw stream over one object version, fetched a window at a time by ranged GETs."""

    def __init__(self, store: S3Store, key: str, *, size: int, e_tag: str | None, window: int) -> None:
        self._store = store
        self._key = key
        self._size = size
        self._e_tag = e_tag
        self._window = window
        self._pos = 0
        self._buffer = memoryview(b"")
        self._buffer_start = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, target: Any) -> int:
        if self._pos >= self._size:
            return 0
        start = self._pos - self._buffer_start
        if not 0 <= start < len(self._buffer):
            self._fetch()
            start = 0
        count = min(len(target), len(self._buffer) - start)
        target[:count] = self._buffer[start:start + count]
        self._pos += count
        return count

    def _fetch(self) -> None:
        end = min(self._pos + self._window, self._size)
        options: dict[str, Any] = {"range": (self._pos, end)}
        if self._e_tag:
            options["if_match"] = self._e_tag
        try:
            data = obstore.get(self._store, self._key, options=options).bytes()  # type: ignore[arg-type]
        except _MISSING as exc:
            raise BlobMissing(f"blob {self._key!r} went missing while read") from exc
        except _DRIVER_ERRORS as exc:
            raise _failure(f"cannot read blob {self._key!r}", exc) from exc
        self._buffer = memoryview(data)
        self._buffer_start = self._pos
        if not self._buffer:
            raise StoreError(f"blob {self._key!r} ended before its size")
