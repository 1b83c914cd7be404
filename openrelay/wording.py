"""Counted words in messages for people: "1 record", "2 records", never "1 records" or "record(s)"."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, word: str, words: str | None = None) -> str:
    """``count`` and ``word``, the word singular where the count is one (``words``, else ``word`` + "s", otherwise):
    ``plural(1, "record")`` is "1 record", ``plural(3, "batch", "batches")`` is "3 batches"."""
    return f"{count} {word if count == 1 else words or word + 's'}"
