"""The blob store interface: where file bytes live (a local directory, or an S3-compatible bucket).

Keys are built by ``blobs.keys`` only; both stores keep the same layout under their root."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol

from ..errors import StoreError

__all__ = ["BlobStore", "BlobWriter", "BlobMissing", "iter_bytes"]


class BlobMissing(StoreError):
    """The key names no blob."""

    code = "blob_missing"


def iter_bytes(blobs: BlobStore, key: str, start: int = 0, chunk_size: int = 1 << 16) -> Iterator[bytes]:
    """The bytes of ``key`` from ``start`` on, a piece at a time (the blob is opened at the first)."""
    with blobs.open(key) as handle:
        handle.seek(start)
        while piece := handle.read(chunk_size):
            yield piece


class BlobWriter(Protocol):
    def write(self, data: bytes) -> int: ...


class BlobStore(Protocol):
    """Keys are ``/``-separated paths. A blob appears whole or not at all: a writer that fails leaves nothing."""

    def writer(self, key: str) -> AbstractContextManager[BlobWriter]:
        """Stream bytes into ``key``; the blob is durable and visible once the context exits cleanly, and an
        exception inside the context leaves no trace of it (an existing blob at ``key`` stays as it was)."""
        ...

    def open(self, key: str) -> AbstractContextManager[BinaryIO]:
        """Read ``key`` as a binary stream (iterating it yields lines). Raises BlobMissing when absent."""
        ...

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(start, length)`` range of ``key`` (within the blob), in the order asked. Raises
        BlobMissing when absent. A worker reads a batch's records in dispatch order by these."""
        ...

    def compose(self, key: str, sources: Iterable[str]) -> int:
        """Write ``key`` as the concatenation of ``sources``; returns its size."""
        ...

    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (every object or file it is made of); absent keys are fine."""
        ...

    def delete_folder(self, folder: str) -> None:
        """Remove every blob whose key starts with ``folder + "/"``, and any write under it that never finished
        (a process killed mid-write): a batch's chunk folder once its result files are composed. An empty or
        absent folder is fine."""
        ...
