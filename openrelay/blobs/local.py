"""Blobs as files under one directory. Writes go to a temporary name, are fsynced, then renamed into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ..errors import StoreError
from .base import BlobMissing
from .keys import check_key

__all__ = ["LocalBlobStore", "BlobMissing"]


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        try:
            return self.root / check_key(key)
        except ValueError as exc:
            raise StoreError(str(exc)) from None

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError as exc:
            raise StoreError(f"cannot write blob {key!r}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb", buffering=1 << 20) as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise StoreError(f"cannot write blob {key!r}: {exc}") from exc
            raise

    @contextlib.contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        try:
            handle = open(self._path(key), "rb", buffering=1 << 20)  # noqa: SIM115 - closed below
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {key!r} is missing") from exc
        except OSError as exc:
            raise StoreError(f"cannot read blob {key!r}: {exc}") from exc
        with handle:
            yield handle

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        with self.open(key) as handle:
            fd = handle.fileno()
            try:
                return [os.pread(fd, length, start) for start, length in ranges]
            except OSError as exc:
                raise StoreError(f"cannot read blob {key!r}: {exc}") from exc

    def compose(self, key: str, sources: Iterable[str]) -> int:
        parts = list(sources)
        if len(parts) == 1 and self._link(parts[0], key):
            return self.size(key)
        with self.writer(key) as out:
            for source in parts:
                with self.open(source) as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
        return self.size(key)

    def _link(self, source: str, key: str) -> bool:
        """``key`` as a second name of the blob ``source`` (a one-part compose, a one-chunk batch's output):
        its bytes were made durable when it was written, and no blob is written in place (every write is a new
        file renamed over the old), so the two names never differ. False where the file system has no hard links."""
        path, source_path = self._path(key), self._path(source)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".tmp-{os.urandom(8).hex()}"
            os.link(source_path, tmp)
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {source!r} is missing") from exc
        except OSError:
            return False
        try:
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"cannot write blob {key!r}: {exc}") from exc
        return True

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {key!r} is missing") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def delete_folder(self, folder: str) -> None:
        path = self._path(folder)
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot delete blobs under {folder!r}: {exc}") from exc
