"""`orl batches create`: settle the endpoint and check it is served, upload the input (unless an earlier attempt
with the same idempotency key did), create, and report the rejections. A create that is refused, or a dry run,
deletes the upload it made again (``--keep-upload`` keeps it): no batch uses that file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from openrelay.cli.endpoints import DEFAULT_ENDPOINT, endpoint_for
from openrelay.cli.http import ApiClient, ApiError, print_json, run, say
from openrelay.cli.rejections import report_rejections
from openrelay.types import TAGS_KEY, Priority
from openrelay.wording import plural

__all__ = ["create", "parse_pairs", "estimate_summary"]


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """``k=v`` arguments to a map; the value may itself contain ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected key=value, got {pair!r}")
        out[key] = value
    return out


def _tag_with(meta: dict[str, str], key: str) -> dict[str, str]:
    """``meta`` with ``key`` added to its ``tags``, when the key can be a tag and the map has room for it."""
    tags = [t.strip() for t in meta.get(TAGS_KEY, "").split(",") if t.strip()]
    if key in tags:
        return meta
    joined = ",".join([*tags, key])
    fits = len(joined) <= 512 and (TAGS_KEY in meta or len(meta) < 32)
    if "," in key or key != key.strip() or not key or not fits:
        return meta
    return {**meta, TAGS_KEY: joined}


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


def _delete_upload(client: ApiClient, file_id: str, why: str) -> None:
    """Delete the file this command uploaded, which no batch uses; a failure to is said, never raised over the
    create's own outcome."""
    try:
        client.delete(f"files/{file_id}")
    except (ApiError, httpx.HTTPError) as exc:
        say(f"could not delete the upload {file_id} ({why}): {exc}")
        return
    say(f"deleted the upload {file_id} again: {why} (--keep-upload keeps it)")


def create(
    input_file: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, readable=True, help="Upload this JSONL, then create."),
    ] = None,
    input_file_id: Annotated[str | None, typer.Option(help="An already uploaded file id.")] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="Endpoint every record targets (default: the url all records of --input-file name; with "
             f"--input-file-id, {DEFAULT_ENDPOINT}). It must be one a model of the catalog serves (`orl "
             "models`), checked before anything is uploaded.", show_default=False)] = None,
    completion_window: Annotated[str, typer.Option(help="Completion window.")] = "24h",
    priority: Annotated[Priority | None, typer.Option(help="Queue tier (server default: standard).")] = None,
    metadata: Annotated[list[str] | None, typer.Option(
        help="key=value; repeatable. Tags are --metadata tags=a,b (comma-separated): the dashboard shows them "
             "as chips, and `orl batches list --tag` finds them.")] = None,
    rejections_out: Annotated[
        str | None, typer.Option(help="Write every rejected record (JSONL) here; '-' for stdout.")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Sent as the Idempotency-Key header; also tags the batch with it.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check every record and estimate tokens and cost; create nothing.")
    ] = False,
    abort_if_error_rate: Annotated[float | None, typer.Option(
        help="Stop the batch early (it ends failed, only what ran is billed) once more than this share (0 to 1) "
             "of the records that ran failed; with --abort-after.", show_default=False)] = None,
    abort_after: Annotated[int | None, typer.Option(
        help="How many records must have run before --abort-if-error-rate is judged.", show_default=False)] = None,
    keep_upload: Annotated[bool, typer.Option(
        "--keep-upload", help="Keep the file --input-file uploaded even when the create is refused or is a dry "
                              "run (otherwise it is deleted again: no batch uses it).")] = False,
) -> None:
    """Create a batch; rejected records are previewed on stderr."""
    if (input_file is None) == (input_file_id is None):
        raise typer.BadParameter("give exactly one of --input-file and --input-file-id")
    meta = parse_pairs(metadata or [])
    if (abort_if_error_rate is None) != (abort_after is None):
        raise typer.BadParameter("give --abort-if-error-rate and --abort-after together")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    if idempotency_key is not None:
        meta = _tag_with(meta, idempotency_key)

    def body(client: ApiClient) -> None:
        chosen = endpoint_for(client, endpoint, input_file)  # before the upload: a refusal here leaves nothing
        file_id = input_file_id
        if input_file is not None and idempotency_key is not None:
            file_id = _earlier_input_file(client, idempotency_key)
        uploaded = None
        if input_file is not None and file_id is None:
            file_id = uploaded = client.upload(input_file, "batch")["id"]
            say(f"uploaded {input_file} as {file_id}")
        request: dict[str, Any] = {"input_file_id": file_id, "endpoint": chosen,
                                   "completion_window": completion_window}
        if priority is not None:
            request["priority"] = priority.value
        if meta:
            request["metadata"] = meta
        if abort_if_error_rate is not None:
            request["failure_threshold"] = {"error_rate": abort_if_error_rate, "min_records": abort_after}
        if dry_run:
            request["dry_run"] = True
        refused = False
        try:
            batch = client.post("batches", request, headers=headers)
        except ApiError as exc:
            refused = 400 <= exc.status < 500  # nothing was created; a 5xx or a lost answer may have made it
            if exc.code == "no_valid_records":
                report_rejections(client, exc.error, rejections_out)
            raise  # run() prints the envelope and exits 2
        finally:
            if uploaded is not None and not keep_upload and (dry_run or refused):
                _delete_upload(client, uploaded, "a dry run" if dry_run else "the create was refused")
        print_json(batch)
        report_rejections(client, batch, rejections_out)
        if dry_run:
            say(estimate_summary(batch))

    run(body)


def estimate_summary(answer: dict[str, Any]) -> str:
    """A dry run's ``openrelay.estimate`` for a person."""
    found = (answer.get("openrelay") or {}).get("estimate") or {}
    counts = answer.get("request_counts") or {}
    runs = int(counts.get("total") or 0) - int(answer.get("rejected_count") or 0)
    low, high = (int(found.get(name) or 0) / 1e9 for name in ("min_cost_nano_usd", "max_cost_nano_usd"))
    return (f"dry run, nothing created: {plural(runs, 'record')} would run on {answer.get('model')}; "
            f"{found.get('input_tokens')} input tokens ({found.get('tokens_counted')}), at most "
            f"{found.get('max_output_tokens')} output tokens; cost ${low:.6f} to ${high:.6f}")
