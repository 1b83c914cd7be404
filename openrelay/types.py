"""Plain domain records shared by every layer. No behaviour beyond derived views."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from .clock import seconds

__all__ = [
    "BatchStatus",
    "TERMINAL",
    "CANCELLABLE",
    "SHOWN_QUEUED",
    "SHOWN_RUNNING",
    "SHOWN_STATUSES",
    "shown_status",
    "Priority",
    "Scope",
    "ALL_SCOPES",
    "Organization",
    "ApiKey",
    "FileRecord",
    "Batch",
    "unknown_progress",
    "Rejection",
    "TAGS_KEY",
    "tag_list",
    "DAY_SECONDS",
    "LIVE_VALUES",
]

DAY_SECONDS = 86_400  # a UTC day: the retention's unit, and the summary counters' created day


TAGS_KEY = "tags"  # the reserved metadata key: a comma-separated list the dashboard draws as chips and filters on


def tag_list(metadata: dict[str, str] | None) -> list[str]:
    """The tags of a batch's metadata, in their written order, each once, without surrounding spaces."""
    raw = (metadata or {}).get(TAGS_KEY, "")
    return list(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"  # created; the scheduler has not yet queued it
    IN_PROGRESS = "in_progress"  # queued (in_progress_at null) or running
    FINALIZING = "finalizing"  # every record settled; result files being written
    COMPLETED = "completed"  # result files written
    FAILED = "failed"  # could not run at all, or its failure_threshold stopped it; ``errors`` says why
    EXPIRED = "expired"  # the window passed before every record ran
    CANCELLING = "cancelling"  # cancel asked; in-flight records finishing
    CANCELLED = "cancelled"  # cancel done; unstarted records are batch_cancelled lines


# The status groups, in one place. Terminal: the batch has ended. Claimable: a worker has work on it (records to run
# or settle, or files to compose), so the claims may hand it out. Records may land: records may still finish.
TERMINAL = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
CLAIMABLE = frozenset({BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING})
RECORDS_MAY_LAND = frozenset({BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING})
# The same as the strings the store and the API hold, in a fixed order (for SQL).
TERMINAL_VALUES = tuple(sorted(s.value for s in TERMINAL))
CLAIMABLE_VALUES = tuple(sorted(s.value for s in CLAIMABLE))
LIVE_VALUES = tuple(sorted(s.value for s in BatchStatus if s not in TERMINAL))  # not ended yet
RECORDS_MAY_LAND_VALUES = tuple(sorted(s.value for s in RECORDS_MAY_LAND))
# What a cancel moves to cancelling; a cancelling batch is on its way there already, an ended one answers 409.
CANCELLABLE = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING})

# The status as a person reads it (the dashboard, the CLI): in_progress is told apart into queued (in_progress_at
# null: waiting for a slot) and running (its first records have started). In lifecycle order:
SHOWN_QUEUED = "queued"
SHOWN_RUNNING = "running"
SHOWN_STATUSES = (BatchStatus.VALIDATING.value, SHOWN_QUEUED, SHOWN_RUNNING, BatchStatus.FINALIZING.value,
                  BatchStatus.COMPLETED.value, BatchStatus.FAILED.value, BatchStatus.EXPIRED.value,
                  BatchStatus.CANCELLING.value, BatchStatus.CANCELLED.value)


def shown_status(status: str, in_progress_at: int | None) -> str:
    """``status`` (a ``BatchStatus`` or its value) as a person reads it, queued and running apart."""
    if status == BatchStatus.IN_PROGRESS:
        return SHOWN_QUEUED if in_progress_at is None else SHOWN_RUNNING
    return str(status)


class Priority(enum.StrEnum):
    STANDARD = "standard"  # the default tier
    EXPEDITED = "expedited"  # queued ahead of standard batches of the same model


class Scope(enum.StrEnum):
    FILES_READ = "files.read"
    FILES_WRITE = "files.write"
    BATCH_READ = "batch.read"
    BATCH_WRITE = "batch.write"


ALL_SCOPES: tuple[str, ...] = tuple(s.value for s in Scope)


@dataclass(frozen=True, kw_only=True)
class Organization:
    id: str
    name: str
    expedited_enabled: bool
    created_at: int


@dataclass(frozen=True, kw_only=True)
class ApiKey:
    id: str
    org_id: str
    prefix: str
    scopes: frozenset[str]
    budget_nano_usd: int | None
    spent_nano_usd: int
    created_at: int
    revoked_at: int | None
    hard_budget: bool = False  # a create reserves the batch's maximum cost against what is left (store/budgets.py)
    reserved_nano_usd: int = 0  # held by its batches that have not ended

    def has_hard_budget(self) -> bool:
        """Whether its creates reserve their maximum cost: it has the flag and a budget to reserve from."""
        return self.hard_budget and self.budget_nano_usd is not None

    def budget_left(self) -> int | None:
        """What it may still spend or reserve, in nano-USD (never below 0); None without a budget."""
        if self.budget_nano_usd is None:
            return None
        return max(0, self.budget_nano_usd - self.spent_nano_usd - self.reserved_nano_usd)

    def fits(self, max_cost_nano_usd: int) -> bool:
        """The rule of a hard budget: spent + reserved + a batch's maximum cost stays within the budget
        (``store/budgets.py``'s ``reserve`` says the same in SQL)."""
        return (self.budget_nano_usd is None
                or self.spent_nano_usd + self.reserved_nano_usd + max_cost_nano_usd <= self.budget_nano_usd)


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    id: str
    org_id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    blob_key: str
    expires_at: int | None = None  # from then on the file is gone (404), and the sweeper deletes it

    def as_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(frozen=True, kw_only=True)
class Rejection:
    line: int
    custom_id: str
    code: str
    message: str

    def as_api(self) -> dict[str, Any]:
        return {"line": self.line, "custom_id": self.custom_id, "code": self.code, "message": self.message}


NOT_STORED = "not_stored"  # marks a Batch field the store has no column for


@dataclass(frozen=True, kw_only=True)
class Batch:
    id: str
    org_id: str
    key_id: str
    endpoint: str
    input_file_id: str
    input_blob_key: str
    completion_window: str
    priority: str
    status: BatchStatus
    model: str
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    rejected_count: int = 0
    rejections_file_id: str | None = None
    input_tokens: int = 0
    cached_tokens: int = 0  # of input_tokens: what the engine's usage details say it served from its cache
    output_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens
    cost_nano_usd: int = 0
    reserved_nano_usd: int = 0  # what it still holds of its key's hard budget (store/budgets.py)
    metadata: dict[str, str] | None = None
    failure_threshold: dict[str, Any] | None = None  # the early abort's rule (failure_threshold.py), or None
    started: bool = False
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    run_failures: int = 0
    throughput_window: str | None = None  # the last minute's durable flushes, as store/throughput.py keeps them
    concurrency_limit: int | None = None  # the adaptive limit its worker runs it at now (null when unknown)
    yielding: bool = False  # its worker leaves the engine to others' requests now (yield_to_interactive)
    unrun: int = 0  # of ``failed``, once it ended: the records that never started (cancelled, expired, failed)
    # The database's clock minus this machine's, measured when a worker claimed it; not a column (NOT_STORED).
    clock_skew: float = dataclasses.field(default=0.0, metadata={NOT_STORED: True})
    # The claim took it from its model's queue (a slot), not as one to end or resume; not a column either.
    from_queue: bool = dataclasses.field(default=False, metadata={NOT_STORED: True})

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def past_window(self) -> bool:
        """Whether the completion window has passed, by the database's clock (the one every worker's claims
        judge it by), read through the skew measured at the claim: no round trip, and a machine whose clock
        runs fast or slow ends the batch when the claims would."""
        return seconds() + self.clock_skew >= self.expires_at

    def claimed_at(self, db_clock: float, local_clock: float, *, from_queue: bool = False) -> Batch:
        """This batch as claimed when the database's clock read ``db_clock``, read just after this machine's
        ``local_clock``: so the skew is never less than it is (bar the database clock's resolution, a millisecond
        on SQLite), and a worker does not judge its window open once the database's clock has passed it (measured
        after the rest of the claim's transaction, it lagged by that transaction's time)."""
        return dataclasses.replace(self, clock_skew=db_clock - local_clock, from_queue=from_queue)

    def as_api(self) -> dict[str, Any]:
        """The batch as the API shows it, the one definition of that shape. ``usage`` has the shape of the OpenAI
        SDK's ``BatchUsage``, every field on every batch (0 where the engine reported no details), plus our
        ``cost_nano_usd``."""
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "priority": self.priority,
            "status": self.status.value,
            "model": self.model,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.input_tokens + self.output_tokens,
                "cost_nano_usd": self.cost_nano_usd,
            },
            "metadata": self.metadata,
            "failure_threshold": self.failure_threshold,
        }


def unknown_progress() -> dict[str, Any]:
    """The batch object's ``openrelay`` progress numbers when none is known (service/progress.py fills them)."""
    return {"queue_position": None, "records_per_second": None, "tokens_per_second": None, "eta_seconds": None,
            "concurrency_limit": None, "yielding": None}

