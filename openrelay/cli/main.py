"""`orl`: the one command. Users' commands talk HTTP; `serve`, `worker` and `admin` are for operators."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import DEFAULT_DATA_DIR, FLAGS, Settings
from . import admin, admin_webhooks, batch_results, batches, files, models, prune
from .flags import refusing_bad_settings, settings_flags

__all__ = ["app", "main"]

app = typer.Typer(help="OpenRelay Batches: OpenAI-compatible batch inference.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(batches.app, name="batches")
batches.app.command("results")(batch_results.results)
batches.app.command("retry")(batch_results.retry)
app.add_typer(files.app, name="files")
app.add_typer(admin.app, name="admin")
admin.app.command("prune")(prune.prune)
admin.app.add_typer(admin_webhooks.webhook_app, name="webhook")
app.command("models")(models.models)

DataDir = Annotated[Path, typer.Option(help="Where the SQLite store and the blobs live.")]
DatabaseUrl = Annotated[str | None, typer.Option(help="sqlite:///... or postgresql://... (default: SQLite in "
                                                     "the data dir).")]
CatalogFile = Annotated[Path | None, typer.Option("--catalog", help="Catalog TOML (default: built-in local "
                                                                    "models).")]


@app.command()
@settings_flags(*FLAGS)  # every one
def serve(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8080,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    catalog: CatalogFile = None,
    database_url: DatabaseUrl = None,
    with_worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Also run a worker here (--no-worker: "
                                              "API only, with `orl worker` processes elsewhere).")] = True,
    **flags: Any,
) -> None:
    """Run the API, the scheduler and a worker in one process."""
    from ..server import serve as run_server

    with refusing_bad_settings():
        settings = Settings.build(data_dir=data_dir, database_url=database_url, catalog_path=catalog, **flags)
        run_server(settings, host=host, port=port, with_worker=with_worker)


@app.command()
@settings_flags("window_seconds", "blob_url", "max_batches", "retention_days")
def worker(
    data_dir: DataDir = DEFAULT_DATA_DIR,
    catalog: CatalogFile = None,
    database_url: DatabaseUrl = None,
    **flags: Any,
) -> None:
    """Run a worker only: claims and runs batches from the shared store (and sweeps it, worker/sweeper.py)."""
    from ..server import run_worker

    with refusing_bad_settings():
        run_worker(Settings.build(data_dir=data_dir, database_url=database_url, catalog_path=catalog, **flags))


def main() -> None:
    app()
