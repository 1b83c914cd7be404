"""What the dashboard's Batch page asks beyond the API's list: its filters, the summary of the filtered set, and
what the new-batch form may offer. Reads need ``batch.read``, as the API's list does."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import ENDPOINTS, Catalog
from ..errors import InvalidRequest
from ..store.accounts import Accounts
from ..store.batch_search import BatchQuery, Summary, search, summarize
from ..store.db import Database
from ..types import SHOWN_STATUSES, ApiKey, Batch, BatchStatus, Priority, Scope
from ..types import shown_status as _shown_status
from .auth import require

__all__ = ["BatchQuery", "BatchPage", "SHOWN_STATUSES", "shown_status", "list_batch_page", "create_options",
           "CreateOptions"]

_FILTER_STATUSES = frozenset(SHOWN_STATUSES) | {BatchStatus.IN_PROGRESS.value}
MAX_PAGE = 100


def shown_status(batch: Batch) -> str:
    """The status as the dashboard reads it: queued and running apart (``types.shown_status``)."""
    return _shown_status(batch.status, batch.in_progress_at)


@dataclass(frozen=True, kw_only=True)
class BatchPage:
    batches: list[Batch]
    has_more: bool
    summary: Summary


def list_batch_page(db: Database, key: ApiKey, query: BatchQuery, *, limit: int = 25,
                    after: str | None = None) -> BatchPage:
    require(key, Scope.BATCH_READ)
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    if query.status is not None and query.status not in _FILTER_STATUSES:
        raise InvalidRequest(f"unknown status {query.status!r}", param="status")
    found, more = search(db, key.org_id, query, limit=limit, after=after)
    return BatchPage(batches=found, has_more=more, summary=summarize(db, key.org_id, query))


@dataclass(frozen=True, kw_only=True)
class CreateOptions:
    endpoints: tuple[str, ...]
    priorities: tuple[str, ...]  # expedited only where the organization has it
    models: tuple[str, ...]


def create_options(accounts: Accounts, catalog: Catalog, key: ApiKey) -> CreateOptions:
    expedited = accounts.org(key.org_id).expedited_enabled
    priorities = (Priority.STANDARD.value, *((Priority.EXPEDITED.value,) if expedited else ()))
    return CreateOptions(endpoints=tuple(ENDPOINTS), priorities=priorities, models=tuple(catalog.names()))
