"""The blob store interface: where file bytes live (a local directory now; S3-compatible storage later)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol

__all__ = ["BlobStore", "BlobWriter"]


class BlobWriter(Protocol):
    def write(self, data: bytes) -> int: ...


class BlobStore(Protocol):
    """Keys are ``/``-separated paths. A blob appears whole or not at all: a writer that fails leaves nothing."""

    def writer(self, key: str) -> AbstractContextManager[BlobWriter]:
        """Stream bytes into ``key``; the blob is durable and visible once the context exits cleanly."""
        ...

    def open(self, key: str) -> AbstractContextManager[BinaryIO]:
        """Read ``key`` as a binary stream (iterating it yields lines). Raises BlobMissing when absent."""
        ...

    def iter_bytes(self, key: str, chunk_size: int = 1 << 16) -> Iterator[bytes]: ...

    def compose(self, key: str, sources: Iterable[str]) -> int:
        """Write ``key`` as the concatenation of ``sources``; returns its size."""
        ...

    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove ``key``; absent keys are fine."""
        ...
