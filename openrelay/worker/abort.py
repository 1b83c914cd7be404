"""The early abort of one run: counts the records it settles and says when the batch's ``failure_threshold`` stops
it (docs/early-abort.md). The counts start from the durable chunks, so a run that resumes a batch judges it by
every record that ran, not only its own."""

from __future__ import annotations

import logging
from typing import Any

from ..failure_threshold import FailureThreshold
from ..store.results import Chunk

__all__ = ["AbortWatch"]

log = logging.getLogger("openrelay.worker")


class AbortWatch:
    def __init__(self, batch_id: str, threshold: FailureThreshold | None) -> None:
        self.batch_id = batch_id
        self.threshold = threshold
        self.ran = 0
        self.failed = 0
        self.error: dict[str, Any] | None = None  # the batch's ``errors`` entry once the threshold stopped it

    def ran_before(self, chunks: list[Chunk]) -> None:
        """Count the records an earlier run made durable (a resumed batch). Chunks hold only lines of records that
        ran: create rejections are in the rejections blob, never here."""
        self.ran += sum(c.completed + c.failed for c in chunks)
        self.failed += sum(c.failed for c in chunks)
        self._judge()

    @property
    def aborted(self) -> bool:
        return self.error is not None

    def settled(self, *, failed: bool) -> None:
        """A record of this run got its line: an output line, or a run-time error line (``failed``)."""
        self.ran += 1
        self.failed += failed
        self._judge()

    def _judge(self) -> None:
        if self.error is None and self.threshold is not None and self.threshold.exceeded(self.ran, self.failed):
            self.error = self.threshold.abort_error(self.ran, self.failed)
            log.warning("batch %s: %d of %d records failed, over its failure_threshold; it starts no more",
                        self.batch_id, self.failed, self.ran)
