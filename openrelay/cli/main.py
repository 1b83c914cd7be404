"""`orl`: the one command. Users' commands talk HTTP; `serve`, `worker` and `admin` are for operators."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from ..config import DEFAULT_DATA_DIR, BatchLimits, HttpLimits, RetentionSettings, Settings, WorkerSettings, env_var
from . import admin, admin_webhooks, batch_results, batches, files, models, prune

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
Window = Annotated[int, typer.Option(help="Seconds in the 24h completion window (tests shorten it).")]
BlobUrl = Annotated[str | None, typer.Option(envvar=env_var(Settings, "blob_url"), show_envvar=True,
                                             help="s3://BUCKET/PREFIX (endpoint, region and credentials from "
                                                  "AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, "
                                                  "AWS_SECRET_ACCESS_KEY) or a directory (default: the data "
                                                  "dir's blobs/).")]


def _shown(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _limit(text: str, name: str) -> str:
    """A request limit's help, with its default and variable as config.HttpLimits writes them (the one place)."""
    return f"{text} (default {_shown(getattr(HttpLimits, name))}, env {env_var(HttpLimits, name)})."


# Request limits: unset, each comes from its environment variable, else its default (config.HttpLimits).
MaxHeaderBytes = Annotated[int | None, typer.Option(min=1, help=_limit("Request line and headers together, in "
                                                                       "bytes; over it: 431", "max_header_bytes"))]
MaxCreateBytes = Annotated[int | None, typer.Option(min=1, help=_limit("Body of POST /v1/batches (inline records) "
                                                                       "and POST /v1/messages/batches, in bytes; "
                                                                       "over it: 413",
                                                                       "max_create_body_bytes"))]
MaxJsonBytes = Annotated[int | None, typer.Option(min=1, help=_limit("Body of every other JSON route, in bytes; "
                                                                     "over it: 413", "max_json_body_bytes"))]
MaxUploadBytes = Annotated[int | None, typer.Option(min=1, help=_limit("File of POST /v1/files, in bytes; over it: "
                                                                       "413 file_too_large", "max_upload_bytes"))]
HeaderTimeout = Annotated[float | None, typer.Option(min=0.001, help=_limit("Seconds from a request's first byte "
                                                                            "to the end of its headers; over it: "
                                                                            "408", "header_timeout_seconds"))]
MaxBatches = Annotated[int | None, typer.Option(min=1, help="Batches this process's worker runs at once, so that "
                                                "a fleet of workers shares the catalog's slots (default: "
                                                f"{env_var(WorkerSettings, 'max_batches')}, else as many as the "
                                                "slots allow).")]
RetentionDays = Annotated[float | None, typer.Option(min=0, help="Batches that ended more than this many days ago "
                                                    "lose their files (bytes included) and rows; fractions allowed "
                                                    "(default: kept forever, env "
                                                    f"{env_var(RetentionSettings, 'retention_days')}).")]
MinExpirySeconds = Annotated[int | None, typer.Option(min=1, help="The least expires_after / output_expires_after "
                                                      "seconds taken (default "
                                                      f"{RetentionSettings.min_expiry_seconds}, OpenAI's; env "
                                                      f"{env_var(RetentionSettings, 'min_expiry_seconds')}).")]
BodyTimeout = Annotated[float | None, typer.Option(min=0.001, help=_limit("Seconds a body being read may send "
                                                                          "nothing; over it: 408",
                                                                          "body_idle_timeout_seconds"))]


@app.command()
def serve(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8080,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    catalog: CatalogFile = None,
    database_url: DatabaseUrl = None,
    window_seconds: Window = BatchLimits.window_seconds,
    with_worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Also run a worker here (--no-worker: "
                                              "API only, with `orl worker` processes elsewhere).")] = True,
    metrics_token: Annotated[str | None, typer.Option(envvar=env_var(Settings, "metrics_token"),
                                                      show_envvar=True,
                                                      help="GET /metrics then needs 'Authorization: Bearer "
                                                           "TOKEN' (default: open).")] = None,
    max_header_bytes: MaxHeaderBytes = None,
    max_create_bytes: MaxCreateBytes = None,
    max_json_bytes: MaxJsonBytes = None,
    max_upload_bytes: MaxUploadBytes = None,
    header_timeout: HeaderTimeout = None,
    body_timeout: BodyTimeout = None,
    blob_url: BlobUrl = None,
    max_batches: MaxBatches = None,
    retention_days: RetentionDays = None,
    min_expiry_seconds: MinExpirySeconds = None,
    access_log: Annotated[bool | None, typer.Option(
        "--access-log/--no-access-log", show_default=False,
        help="A log line per request: method, path, status, time, organization; never a key, a query or a body "
             f"(default on, env {env_var(HttpLimits, 'access_log')}=0 turns it off).")] = None,
) -> None:
    """Run the API, the scheduler and a worker in one process."""
    from ..server import serve as run_server

    with _refusing_bad_catalogs():
        settings = _with_flags(Settings.build(data_dir=data_dir, database_url=database_url, catalog_path=catalog,
                                              window_seconds=window_seconds, metrics_token=metrics_token,
                                              blob_url=blob_url),
                               max_batches=max_batches, max_header_bytes=max_header_bytes,
                               max_create_body_bytes=max_create_bytes, max_json_body_bytes=max_json_bytes,
                               max_upload_bytes=max_upload_bytes, header_timeout_seconds=header_timeout,
                               body_idle_timeout_seconds=body_timeout, access_log=access_log,
                               retention={"retention_days": retention_days, "min_expiry_seconds": min_expiry_seconds})
        run_server(settings, host=host, port=port, with_worker=with_worker)


@app.command()
def worker(
    data_dir: DataDir = DEFAULT_DATA_DIR,
    catalog: CatalogFile = None,
    database_url: DatabaseUrl = None,
    window_seconds: Window = BatchLimits.window_seconds,
    blob_url: BlobUrl = None,
    max_batches: MaxBatches = None,
    retention_days: RetentionDays = None,
) -> None:
    """Run a worker only: claims and runs batches from the shared store (and sweeps it, worker/sweeper.py)."""
    from ..server import run_worker

    with _refusing_bad_catalogs():
        settings = _with_flags(Settings.build(data_dir=data_dir, database_url=database_url, catalog_path=catalog,
                                              window_seconds=window_seconds, blob_url=blob_url),
                               max_batches=max_batches, retention={"retention_days": retention_days})
        run_worker(settings)


def _with_flags(settings: Settings, *, max_batches: int | None, retention: dict[str, float | None] | None = None,
                **http: float | bool | None) -> Settings:
    """The flags given (those not None) over what the environment and the defaults said."""
    import dataclasses

    limits = {name: value for name, value in http.items() if value is not None}
    worker = {} if max_batches is None else {"max_batches": max_batches}
    kept = {name: value for name, value in (retention or {}).items() if value is not None}
    return dataclasses.replace(settings, http=dataclasses.replace(settings.http, **limits),
                               worker=dataclasses.replace(settings.worker, **worker),
                               retention=dataclasses.replace(settings.retention, **kept))


@contextlib.contextmanager
def _refusing_bad_catalogs() -> Iterator[None]:
    """A catalog or setting the process cannot start with: its message on stderr and exit 2, not a traceback."""
    from ..errors import CatalogError, ConfigError

    try:
        yield
    except (CatalogError, ConfigError) as exc:
        typer.echo(f"orl: {exc.message}", err=True)
        raise typer.Exit(2) from None


def main() -> None:
    app()
