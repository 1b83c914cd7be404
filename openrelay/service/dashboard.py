"""What the dashboard's Batch page asks beyond the API's list: its filters, the summary of the filtered set, what
the new-batch form may offer, and which batches each file fed. Reads need ``batch.read``, as the API's list does."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Catalog
from ..errors import InvalidRequest
from ..store.accounts import Accounts
from ..store.batch_search import BatchQuery, Summary, search, summarize
from ..store.db import Database
from ..store.files import Files, FileUses
from ..types import SHOWN_STATUSES, ApiKey, Batch, BatchStatus, Priority, Scope
from .auth import require
from .endpoint_guess import served_endpoints

__all__ = ["BatchQuery", "BatchPage", "SHOWN_STATUSES", "list_batch_page", "create_options",
           "CreateOptions", "file_uses", "FileUses"]

_FILTER_STATUSES = frozenset(SHOWN_STATUSES) | {BatchStatus.IN_PROGRESS.value}
MAX_PAGE = 100


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
    endpoints: tuple[str, ...]  # only those some model of the catalog serves
    priorities: tuple[str, ...]  # expedited only where the organization has it
    models: tuple[str, ...]


def create_options(accounts: Accounts, catalog: Catalog, key: ApiKey) -> CreateOptions:
    expedited = accounts.org(key.org_id).expedited_enabled
    priorities = (Priority.STANDARD.value, *((Priority.EXPEDITED.value,) if expedited else ()))
    return CreateOptions(endpoints=served_endpoints(catalog), priorities=priorities, models=tuple(catalog.names()))


def file_uses(files: Files, key: ApiKey, file_ids: list[str], *, newest: int = 5) -> dict[str, FileUses]:
    """The batches made from each of ``file_ids``, the ``newest`` of each named; none to a key that may not read
    batches."""
    require(key, Scope.FILES_READ)
    if Scope.BATCH_READ not in key.scopes:
        return {}
    return files.batches_reading(key.org_id, file_ids, newest=newest)
