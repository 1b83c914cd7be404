"""`orl admin prune [--dry-run]`: the sweeper's work on demand (worker/sweeper.py), on the store and blob store
`orl admin` was given; prints what it removed, or with --dry-run what it would remove, as JSON."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import typer

from .admin import admin_settings
from .flags import settings_flags

__all__ = ["prune"]


@settings_flags("retention_days")
def prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be removed; remove nothing.")] = False,
    **flags: Any,
) -> None:
    """Delete expired files, batches past the retention with their bytes, old bookkeeping and webhook logs."""
    from ..errors import OpenRelayError
    from ..runtime import open_blob_store
    from ..store.db import Database
    from ..store.retention import Retention
    from ..store.webhook_log import WebhookLog
    from ..worker.sweeper import prune as prune_now

    settings = admin_settings(**flags)
    retention = settings.retention
    try:
        blobs = open_blob_store(settings)
        db = Database(settings.database_url, settings.database)
        db.migrate()
        try:
            swept = prune_now(Retention(db), blobs, retention, dry_run=dry_run)
            log = None if dry_run else WebhookLog(db).prune_delivery_log(
                older_than=settings.webhooks.log_keep_seconds)  # what the delivery loops prune hourly
        finally:
            db.dispose()
    except OpenRelayError as exc:
        typer.echo(f"orl: {exc.message}", err=True)
        raise typer.Exit(1) from None
    shown = swept.as_json()
    if dry_run:
        shown.pop("blobs")
    if log is not None:
        shown |= {"webhook_deliveries": log.deliveries, "webhook_events": log.events}
    typer.echo(orjson.dumps({"dry_run": dry_run, "retention_days": retention.retention_days,
                             "would_remove" if dry_run else "removed": shown}, option=orjson.OPT_INDENT_2).decode())
    said = ", ".join(f"{value} {name}" for name, value in shown.items() if value)
    typer.echo(f"{'would remove' if dry_run else 'removed'}: {said or 'nothing'}", err=True)
