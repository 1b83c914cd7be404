"""`orl batches ...`: create, inspect, list, cancel, re-tag and wait for batches (the /v1/batches API)."""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from openrelay.cli.http import ApiClient, ApiError, print_json, run, say
from openrelay.config import LIVE_POLL_SECONDS
from openrelay.types import SHOWN_QUEUED, TERMINAL, shown_status

__all__ = ["app", "parse_pairs", "rejection_preview", "live_numbers", "estimate_summary"]

app = typer.Typer(help="Create, inspect, list, cancel and wait for batches.", no_args_is_help=True)

PREVIEW_LIMIT = 10

BatchId = Annotated[str, typer.Argument(help="Batch id, e.g. batch_9f8e7d6c5b4a.")]


class Priority(StrEnum):
    standard = "standard"
    expedited = "expedited"


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """``k=v`` arguments to a map; the value may itself contain ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected key=value, got {pair!r}")
        out[key] = value
    return out


def rejection_preview(records: list[dict[str, Any]], count: int) -> list[str]:
    """Human lines for up to PREVIEW_LIMIT rejected records, plus how many were left out."""
    lines = []
    for rec in records[:PREVIEW_LIMIT]:
        # An unreadable line has an empty custom_id; show "" so the columns stay countable.
        custom_id = rec.get("custom_id") or '""'
        lines.append(f"line {rec.get('line')}  {custom_id}  {rec.get('code')}  {rec.get('message')}")
    hidden = max(count, len(records)) - min(len(records), PREVIEW_LIMIT)
    if hidden > 0:
        lines.append(f"... and {hidden} more")
    return lines


def _report_rejections(client: ApiClient, info: dict[str, Any], rejections_out: str | None) -> None:
    """Shared by the 200 (fields on the batch) and the 400 no_valid_records (fields on the error object)."""
    records = info.get("rejected_records") or []
    count = int(info.get("rejected_count") or len(records))
    file_id = info.get("rejected_records_file_id")
    if count > 0:
        say(f"rejected {count} record(s):")
        for line in rejection_preview(records, count):
            say(f"  {line}")
        if file_id:
            say(f"rejections file: {file_id}")
    if rejections_out is None:
        return
    if file_id:
        client.download_to(f"files/{file_id}/content", rejections_out)
    elif rejections_out != "-":
        # No rejections: an empty file still tells a script "nothing was rejected".
        Path(rejections_out).write_bytes(b"")


def _tag_with(meta: dict[str, str], key: str) -> dict[str, str]:
    """``meta`` with ``key`` added to its ``tags``, when the key can be a tag and the map has room for it."""
    tags = [t.strip() for t in meta.get("tags", "").split(",") if t.strip()]
    if key in tags:
        return meta
    joined = ",".join([*tags, key])
    fits = len(joined) <= 512 and ("tags" in meta or len(meta) < 32)
    if "," in key or key != key.strip() or not key or not fits:
        return meta
    return {**meta, "tags": joined}


def _earlier_input_file(client: ApiClient, idempotency_key: str) -> str | None:
    """The input file of the batch an earlier attempt made with this key (it carries the key as a tag), if any.

    Reusing it, before uploading anything, makes the retry's body byte-identical to the first attempt's, which the
    server answers with the stored batch instead of a second one.
    """
    try:
        page = client.get("batches", {"tag": idempotency_key, "limit": 100}).get("data") or []
    except ApiError as exc:
        if exc.status != 403:
            raise
        # A key without batch.read can still create: it just cannot look for an earlier attempt.
        say(f"cannot look for an earlier batch with idempotency key {idempotency_key!r}: {exc.message}")
        return None
    # A batch `orl batches retry` made of the first one's failures carries its tags too, the key among them.
    found = [b for b in page if "retry_of" not in (b.get("metadata") or {})]
    if not found:
        return None
    say(f"batch {found[0]['id']} already has idempotency key {idempotency_key!r}; "
        f"reusing its input file {found[0]['input_file_id']}")
    return str(found[0]["input_file_id"])


@app.command()
def create(
    input_file: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, readable=True, help="Upload this JSONL, then create."),
    ] = None,
    input_file_id: Annotated[str | None, typer.Option(help="An already uploaded file id.")] = None,
    endpoint: Annotated[str, typer.Option(help="Endpoint every record targets.")] = "/v1/chat/completions",
    completion_window: Annotated[str, typer.Option(help="Completion window.")] = "24h",
    priority: Annotated[Priority | None, typer.Option(help="Queue tier (server default: standard).")] = None,
    metadata: Annotated[list[str] | None, typer.Option(help="key=value; repeatable.")] = None,
    rejections_out: Annotated[
        str | None, typer.Option(help="Write every rejected record (JSONL) here; '-' for stdout.")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Sent as the Idempotency-Key header; also tags the batch with it.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check every record and estimate tokens and cost; create nothing.")
    ] = False,
) -> None:
    """Create a batch; rejected records are previewed on stderr."""
    if (input_file is None) == (input_file_id is None):
        raise typer.BadParameter("give exactly one of --input-file and --input-file-id")
    meta = parse_pairs(metadata or [])
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    if idempotency_key is not None:
        meta = _tag_with(meta, idempotency_key)

    def body(client: ApiClient) -> None:
        file_id = input_file_id
        if input_file is not None and idempotency_key is not None:
            file_id = _earlier_input_file(client, idempotency_key)
        uploaded_for_dry_run = None
        if input_file is not None and file_id is None:
            uploaded = client.upload(input_file, "batch")
            file_id = uploaded["id"]
            say(f"uploaded {input_file} as {file_id}")
            if dry_run:
                uploaded_for_dry_run = file_id
        request: dict[str, Any] = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if priority is not None:
            request["priority"] = priority.value
        if meta:
            request["metadata"] = meta
        if dry_run:
            request["dry_run"] = True
        try:
            batch = client.post("batches", request, headers=headers)
        except ApiError as exc:
            if exc.code == "no_valid_records":
                _report_rejections(client, exc.error, rejections_out)
            raise  # run() prints the envelope and exits 2
        finally:
            if uploaded_for_dry_run is not None:  # a dry run leaves nothing behind, not even its upload
                client.delete(f"files/{uploaded_for_dry_run}")
                say(f"deleted {uploaded_for_dry_run} again (dry run)")
        print_json(batch)
        _report_rejections(client, batch, rejections_out)
        if dry_run:
            say(estimate_summary(batch))

    run(body)


@app.command()
def get(batch_id: BatchId) -> None:
    """Print a batch."""
    run(lambda client: print_json(client.get(f"batches/{batch_id}")))


@app.command("list")
def list_batches(
    limit: Annotated[int | None, typer.Option(min=1, max=100, help="Page size (server default 20).")] = None,
    after: Annotated[str | None, typer.Option(help="Start after this batch id.")] = None,
    status: Annotated[str | None, typer.Option(help="Only batches with this status.")] = None,
    model: Annotated[str | None, typer.Option(help="Only batches of this model.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only batches carrying this tag.")] = None,
) -> None:
    """List batches, newest first (one page)."""
    params = {"limit": limit, "after": after, "status": status, "model": model, "tag": tag}
    run(lambda client: print_json(client.get("batches", params)))


@app.command()
def cancel(batch_id: BatchId) -> None:
    """Cancel a running batch (409 when it is already terminal)."""
    run(lambda client: print_json(client.post(f"batches/{batch_id}/cancel")))


@app.command()
def metadata(
    batch_id: BatchId,
    pairs: Annotated[list[str] | None, typer.Argument(help="key=value pairs; none clears the map.")] = None,
) -> None:
    """Replace a batch's whole metadata map."""
    meta = parse_pairs(pairs or [])
    run(lambda client: print_json(client.post(f"batches/{batch_id}/metadata", {"metadata": meta})))


def estimate_summary(answer: dict[str, Any]) -> str:
    """A dry run's ``openrelay.estimate`` for a person."""
    found = (answer.get("openrelay") or {}).get("estimate") or {}
    counts = answer.get("request_counts") or {}
    runs = int(counts.get("total") or 0) - int(answer.get("rejected_count") or 0)
    low, high = (int(found.get(name) or 0) / 1e9 for name in ("min_cost_nano_usd", "max_cost_nano_usd"))
    return (f"dry run, nothing created: {runs} record(s) would run on {answer.get('model')}; "
            f"{found.get('input_tokens')} input tokens ({found.get('tokens_counted')}), at most "
            f"{found.get('max_output_tokens')} output tokens; cost ${low:.6f} to ${high:.6f}")


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


def _draw(progress: Progress, task: TaskID, batch: dict[str, Any]) -> None:
    counts = batch.get("request_counts") or {}
    total = int(counts.get("total") or 0)
    done = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
    # Total is unknown (0) while validating: an indeterminate bar rather than a misleading 0/0.
    progress.update(task, total=total or None, completed=done, description=_describe(batch),
                    live=live_numbers(batch))


def _counted(batch: dict[str, Any]) -> str:
    counts = batch.get("request_counts") or {}
    return f"{int(counts.get('completed') or 0) + int(counts.get('failed') or 0)}/{int(counts.get('total') or 0)}"


@app.command()
def wait(
    batch_id: BatchId,
    interval: Annotated[float, typer.Option(min=0.0, help="Seconds between polls.")] = LIVE_POLL_SECONDS,
) -> None:
    """Poll a batch until it is terminal, drawing progress on stderr; print the final batch."""

    def body(client: ApiClient) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[live]}"))
        with Progress(*columns, console=Console(stderr=True)) as progress:
            task = progress.add_task(batch_id, total=None, live="")
            said = ""
            while True:
                batch = client.get(f"batches/{batch_id}")
                _draw(progress, task, batch)
                if not progress.console.is_terminal:  # no live bar (a log, a pipe): a line whenever it changes
                    line = f"{_describe(batch)}  {_counted(batch)}  {live_numbers(batch)}".rstrip()
                    if line != said:
                        say(line)
                        said = line
                if batch.get("status") in TERMINAL:
                    break
                time.sleep(interval)
        print_json(batch)

    run(body)
