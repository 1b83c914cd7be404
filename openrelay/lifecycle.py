"""A batch's lifecycle in one place: which status moves to which and why (``TRANSITIONS``, each guarded in the
store by the statuses it starts from, so the database refuses any other: ``TransitionRefused``), how a batch ends
(``decide_end``, ``final_status``) and the codes of the records an end leaves unrun (``End``). Drawn:
docs/design.md, "A batch's lifecycle"."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import StoreError
from .types import CANCELLABLE, BatchStatus

__all__ = ["Transition", "QUEUE", "CANCEL", "ALL_LINED", "ENDS", "TRANSITIONS", "End", "decide_end", "final_status",
           "TransitionRefused"]

_S = BatchStatus


@dataclass(frozen=True)
class Transition:
    to: BatchStatus
    sources: frozenset[BatchStatus]  # the statuses it may start from: the store's guard
    why: str

    @property
    def source_values(self) -> tuple[str, ...]:
        """The sources as the store holds them, in a fixed order (for SQL)."""
        return tuple(sorted(s.value for s in self.sources))


# A batch is created ``validating``, or ``finalizing`` when the create rejected every record (nothing to run).
QUEUE = Transition(_S.IN_PROGRESS, frozenset({_S.VALIDATING}), "a claim queues it for a slot of its model")
CANCEL = Transition(_S.CANCELLING, CANCELLABLE, "the user cancels: records in flight finish, no other starts")
ALL_LINED = Transition(_S.FINALIZING, frozenset({_S.IN_PROGRESS}), "its run ended with every record's line durable")
_RUNNING = frozenset({_S.IN_PROGRESS, _S.FINALIZING})
ENDS = {  # the terminal transitions, each in the one transaction that writes the result files' rows
    _S.COMPLETED: Transition(_S.COMPLETED, _RUNNING, "every record has its line (an expiry that finds none left too)"),
    _S.CANCELLED: Transition(_S.CANCELLED, frozenset({_S.CANCELLING}), "a cancel's records in flight have finished"),
    # From cancelling too: the window, or the failure, came before the cancel reached the worker.
    _S.EXPIRED: Transition(_S.EXPIRED, _RUNNING | {_S.CANCELLING}, "the window ended with records unrun"),
    _S.FAILED: Transition(_S.FAILED, _RUNNING | {_S.CANCELLING}, "its model left the catalog, its runs kept "
                                                                 "failing, or its failure_threshold stopped it"),
}
TRANSITIONS = (QUEUE, CANCEL, ALL_LINED, *ENDS.values())


class TransitionRefused(StoreError):
    """The store refused a change of status that its row's status does not allow (a worker's, not an answer)."""

    code = "transition_refused"


class End(enum.Enum):
    """How a batch ends: its terminal status, and the code of the error line of each record it leaves unrun."""

    COMPLETED = (_S.COMPLETED, None, "")
    CANCELLED = (_S.CANCELLED, "batch_cancelled", "the batch was cancelled")
    EXPIRED = (_S.EXPIRED, "batch_expired", "the batch's completion window ended")
    FAILED = (_S.FAILED, "batch_failed", "the batch failed")  # its runs kept failing, or its model left
    ABORTED = (_S.FAILED, "batch_aborted", "the batch was stopped by its failure_threshold (too many of its records "
                                           "failed)")

    def __init__(self, status: BatchStatus, unrun_code: str | None, why: str) -> None:
        self.status = status
        self.unrun_code = unrun_code
        self.why = why

    def unrun_message(self, *, waiting: bool = False) -> str:
        """What an unrun record's error line says: it never started, or (``waiting``) it had started and waited
        for an engine that was not answering when the batch stopped."""
        if waiting:
            return f"{self.why} while this request waited for its engine, which was not answering"
        return f"{self.why} before this request started"


def decide_end(status: BatchStatus, *, past_window: bool, model_offered: bool = True, aborted: bool = False,
               runs_failed: bool = False) -> End | None:
    """How a batch that has ``status`` now ends, or None while it has records to run (as it is claimed: it runs;
    as its run ends: a draining worker hands it back, and any other run failed). In order: a cancel; its
    failure_threshold (``aborted``); runs that kept failing (``runs_failed``: failed, or expired past its window);
    every record lined (``finalizing``); its model gone from the catalog; its window passed."""
    if status is _S.CANCELLING:
        return End.CANCELLED
    if aborted:
        return End.ABORTED
    if runs_failed:
        return End.EXPIRED if past_window else End.FAILED
    if status is _S.FINALIZING:
        return End.COMPLETED
    if not model_offered:
        return End.FAILED
    return End.EXPIRED if past_window else None


def final_status(status: BatchStatus, *, unrun: int | None, current: BatchStatus) -> BatchStatus:
    """The status an ending of ``status`` writes, read in its transaction with the row's ``current`` one: an
    expiry that left no record unrun (``unrun``: None when they were not counted) completed, and a batch cancelled
    while its files were composed (every record ran) is cancelled, as the user asked."""
    if status is _S.EXPIRED and unrun == 0:
        return _S.COMPLETED
    if status is _S.COMPLETED and current is _S.CANCELLING:
        return _S.CANCELLED
    return status
