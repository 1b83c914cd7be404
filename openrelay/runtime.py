"""The one factory: builds the store, blob store and catalog from settings. Nothing else constructs them."""

from __future__ import annotations

from dataclasses import dataclass

from .blobs.base import BlobStore
from .blobs.local import LocalBlobStore
from .catalog import Catalog, load_catalog
from .config import Settings
from .engines.factory import check_engines
from .store.accounts import Accounts
from .store.batches import Batches
from .store.db import Database
from .store.files import Files
from .store.idempotency import IdempotencyKeys
from .store.results import Results
from .store.sessions import Sessions

__all__ = ["Runtime", "open_runtime", "open_store"]


@dataclass(frozen=True, kw_only=True)
class Runtime:
    settings: Settings
    db: Database
    accounts: Accounts
    files: Files
    batches: Batches
    idempotency: IdempotencyKeys
    results: Results
    sessions: Sessions
    blobs: BlobStore
    catalog: Catalog

    def close(self) -> None:
        self.db.dispose()


def open_store(database_url: str) -> tuple[Database, Accounts]:
    """Just the database (for ``orl admin``): migrated, with the accounts view."""
    db = Database(database_url)
    db.migrate()
    return db, Accounts(db)


def open_runtime(settings: Settings) -> Runtime:
    """Raises ``CatalogError`` before touching the store when the catalog is unusable."""
    catalog = load_catalog(settings.catalog_path)
    check_engines(catalog)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url)
    db.migrate()
    return Runtime(
        settings=settings,
        db=db,
        accounts=Accounts(db),
        files=Files(db),
        batches=Batches(db),
        idempotency=IdempotencyKeys(db, keep_seconds=settings.idempotency_seconds,
                                    claim_seconds=settings.idempotency_claim_seconds),
        results=Results(db),
        sessions=Sessions(db),
        blobs=LocalBlobStore(settings.blob_dir),
        catalog=catalog,
    )
