"""The one factory: builds the store, blob store and catalog from settings. Nothing else constructs them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .blobs.base import BlobStore
from .blobs.local import LocalBlobStore
from .catalog import Catalog, load_catalog
from .config import Settings
from .engines.factory import check_engines
from .errors import ConfigError
from .store.accounts import Accounts
from .store.batches import Batches
from .store.db import Database
from .store.engine_limits import EngineLimits
from .store.files import Files
from .store.idempotency import IdempotencyKeys
from .store.leases import BatchLeases
from .store.results import Results
from .store.retention import Retention
from .store.sessions import Sessions
from .store.webhook_endpoints import WebhookEndpoints
from .store.webhook_log import WebhookLog
from .store.webhook_outbox import WebhookOutbox
from .store.workers import WorkerRegistry

__all__ = ["Runtime", "open_runtime", "open_store", "open_blob_store", "check_blob_url"]


@dataclass(frozen=True, kw_only=True)
class Runtime:
    settings: Settings
    db: Database
    accounts: Accounts
    files: Files
    batches: Batches  # as the API reads and edits them
    leases: BatchLeases  # as the workers claim, lease and end them
    idempotency: IdempotencyKeys
    results: Results
    retention: Retention  # expiry, the operator's retention and bookkeeping (the sweeper's)
    sessions: Sessions
    webhook_endpoints: WebhookEndpoints  # an organization's endpoints
    webhook_outbox: WebhookOutbox  # events and their deliveries, as the delivery loops claim them
    webhook_log: WebhookLog  # the delivery log: attempts, replays, pruning
    limits: EngineLimits  # what the adaptive concurrency limiters learnt
    workers: WorkerRegistry  # the live worker processes (heartbeats)
    blobs: BlobStore
    catalog: Catalog

    def close(self) -> None:
        self.db.dispose()


def open_store(database_url: str) -> tuple[Database, Accounts]:
    """Just the database (for ``orl admin``): migrated, with the accounts view."""
    db = Database(database_url)
    db.migrate()
    return db, Accounts(db)


def check_blob_url(url: str | None) -> None:
    """Refuse (``ConfigError``) a ``--blob-url`` no store can serve, without reaching the store (``orl admin``)."""
    _blob_location(url, Path("."))


def open_blob_store(settings: Settings, environ: Mapping[str, str] | None = None) -> BlobStore:
    """The local directory under ``--data-dir`` unless ``--blob-url`` names another one or an S3 bucket, whose
    endpoint, region and credentials come from the standard AWS variables. A bucket is listed once here, so one
    that is missing or refused stops the process at start (``ConfigError``)."""
    location = _blob_location(settings.blob_url, settings.blob_dir)
    if isinstance(location, Path):
        return LocalBlobStore(location)
    from .blobs.s3 import S3BlobStore  # imported here: obstore is only loaded by processes that use it

    blobs = S3BlobStore.from_environment(location, os.environ if environ is None else environ)
    blobs.check_reachable()
    return blobs


def _blob_location(url: str | None, default: Path) -> Path | str:
    """A local directory as a Path, an S3 URL as it was given (checked)."""
    if not url:
        return default
    scheme = urlsplit(url).scheme
    if scheme == "s3":
        from .blobs.s3 import S3Location

        S3Location.parse(url)
        return url
    if scheme == "file":
        return Path(urlsplit(url).path)
    if scheme:
        raise ConfigError(f"--blob-url {url!r}: expected s3://BUCKET/PREFIX or a local directory")
    return Path(url).expanduser().resolve()


def open_runtime(settings: Settings) -> Runtime:
    """Raises ``CatalogError`` before touching the store when the catalog is unusable, ``ConfigError`` when the
    blob store is."""
    catalog = load_catalog(settings.catalog_path)
    check_engines(catalog)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    blobs = open_blob_store(settings)
    db = Database(settings.database_url, settings.database)
    db.migrate()
    return Runtime(
        settings=settings,
        db=db,
        accounts=Accounts(db),
        files=Files(db),
        batches=Batches(db),
        leases=BatchLeases(db),
        idempotency=IdempotencyKeys(db, keep_seconds=settings.idempotency.keep_seconds,
                                    claim_seconds=settings.idempotency.claim_seconds),
        results=Results(db),
        retention=Retention(db),
        sessions=Sessions(db),
        webhook_endpoints=WebhookEndpoints(db),
        webhook_outbox=WebhookOutbox(db),
        webhook_log=WebhookLog(db),
        limits=EngineLimits(db),
        workers=WorkerRegistry(db),
        blobs=blobs,
        catalog=catalog,
    )
