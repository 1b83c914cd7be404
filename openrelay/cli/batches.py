"""`orl batches ...`: create, inspect, list, cancel, re-tag and wait for batches (the /v1/batches API)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from openrelay.cli.create import create, parse_pairs
from openrelay.cli.http import ApiClient, print_json, run, say
from openrelay.config import LIVE_POLL_SECONDS
from openrelay.types import SHOWN_QUEUED, TERMINAL, BatchStatus, shown_status

__all__ = ["app", "BatchId", "live_numbers"]

app = typer.Typer(help="Create, inspect, list, cancel and wait for batches.", no_args_is_help=True)
app.command()(create)

BatchId = Annotated[str, typer.Argument(help="Batch id, e.g. batch_9f8e7d6c5b4a.")]


@app.command()
def get(batch_id: BatchId) -> None:
    """Print a batch."""
    run(lambda client: print_json(client.get(f"batches/{batch_id}")))


@app.command("list")
def list_batches(
    limit: Annotated[int | None, typer.Option(min=1, max=100, help="Page size (server default 20).")] = None,
    after: Annotated[str | None, typer.Option(help="Start after this batch id.")] = None,
    status: Annotated[BatchStatus | None, typer.Option(help="Only batches with this status.")] = None,
    model: Annotated[str | None, typer.Option(help="Only batches of this model.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only batches carrying this tag.")] = None,
) -> None:
    """List batches, newest first (one page)."""
    params = {"limit": limit, "after": after, "status": status and status.value, "model": model, "tag": tag}
    run(lambda client: print_json(client.get("batches", params)))


@app.command()
def cancel(batch_id: BatchId) -> None:
    """Cancel a running batch (409 when it is already terminal)."""
    run(lambda client: print_json(client.post(f"batches/{batch_id}/cancel")))


@app.command()
def metadata(
    batch_id: BatchId,
    pairs: Annotated[list[str] | None, typer.Argument(
        help="key=value pairs: the whole new map (tags=a,b for the dashboard's chips); none prints the map as it "
             "is.", show_default=False)] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove every key (give no pairs).")] = False,
) -> None:
    """Print a batch's metadata map, or replace it whole with PAIRS (or empty it with --clear)."""
    if clear and pairs:
        raise typer.BadParameter("give key=value pairs or --clear, not both")
    if not pairs and not clear:
        run(lambda client: print_json(client.get(f"batches/{batch_id}").get("metadata") or {}))
        return
    meta = parse_pairs(pairs or [])
    run(lambda client: print_json(client.post(f"batches/{batch_id}/metadata", {"metadata": meta})))


def _describe(batch: dict[str, Any]) -> str:
    status = str(batch.get("status"))
    if shown_status(status, batch.get("in_progress_at")) == SHOWN_QUEUED:  # in_progress, but nothing started yet
        status = f"{status} ({SHOWN_QUEUED})"
    return f"{batch.get('id')} {status}"


def live_numbers(batch: dict[str, Any]) -> str:
    """The batch's live progress numbers (its ``openrelay`` object) for a person: what is known of them."""
    live = batch.get("openrelay") or {}
    shown = []
    if live.get("queue_position") is not None:
        shown.append(f"queue #{live['queue_position']}")
    if live.get("records_per_second") is not None:
        shown.append(f"{live['records_per_second']:.3g} rec/s")
    if live.get("tokens_per_second") is not None:
        shown.append(f"{live['tokens_per_second']:.3g} tok/s")
    if live.get("eta_seconds") is not None:
        minutes, seconds = divmod(int(live["eta_seconds"]), 60)
        hours, minutes = divmod(minutes, 60)
        shown.append(f"ETA {hours}:{minutes:02d}:{seconds:02d}")
    return "  ".join(shown)


def _counts(batch: dict[str, Any]) -> tuple[int, int]:
    """(records settled, total)."""
    counts = batch.get("request_counts") or {}
    return int(counts.get("completed") or 0) + int(counts.get("failed") or 0), int(counts.get("total") or 0)


@app.command()
def wait(
    batch_id: BatchId,
    interval: Annotated[float, typer.Option(min=0.0, help="Seconds between polls.")] = LIVE_POLL_SECONDS,
) -> None:
    """Poll a batch until it is terminal, drawing progress on stderr; print the final batch."""

    def body(client: ApiClient) -> None:
        batch = client.get(f"batches/{batch_id}")  # an unknown batch is refused here, before any bar is drawn
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[live]}"))
        with Progress(*columns, console=Console(stderr=True)) as progress:
            task = progress.add_task(batch_id, total=None, live="")
            said = ""
            while True:
                done, total = _counts(batch)
                # Total is unknown (0) while validating: an indeterminate bar rather than a misleading 0/0.
                progress.update(task, total=total or None, completed=done, description=_describe(batch),
                                live=live_numbers(batch))
                if not progress.console.is_terminal:  # no live bar (a log, a pipe): a line whenever it changes
                    line = f"{_describe(batch)}  {done}/{total}  {live_numbers(batch)}".rstrip()
                    if line != said:
                        say(line)
                        said = line
                if batch.get("status") in TERMINAL:
                    break
                time.sleep(interval)
                batch = client.get(f"batches/{batch_id}")
        print_json(batch)

    run(body)
