"""`orl batches results` (a batch's result lines, while it runs too) and `orl batches retry` (a new batch of its
failures). Registered on `orl batches` by ``cli/main.py``."""

from __future__ import annotations

import sys
import time
from enum import StrEnum
from typing import Annotated, Any

import typer

from openrelay.cli.batches import BatchId
from openrelay.cli.http import ApiClient, ApiError, print_json, run, say
from openrelay.cli.rejections import report_rejections
from openrelay.config import LIVE_POLL_SECONDS
from openrelay.ids import RESULT_KINDS, result_file_id
from openrelay.types import TERMINAL
from openrelay.wording import plural

__all__ = ["results", "retry"]


class Kind(StrEnum):
    all = "all"
    output = "output"
    error = "error"


def _new_lines(client: ApiClient, batch_id: str, kind: str, offset: int) -> int:
    """Write what the batch's ``kind`` result file holds past ``offset`` to stdout; how many bytes that was. The
    file only ever grows at its end (each read extends the one before), so reading on from an offset shows every
    line once."""
    sys.stdout.flush()
    return client.download_from(f"files/{result_file_id(batch_id, kind)}/content", offset, sys.stdout.buffer)


def results(
    batch_id: BatchId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing lines as they land; exit when the "
                                         "batch has ended.")] = False,
    kind: Annotated[Kind, typer.Option(help="Which file's lines: output, error or all.")] = Kind.all,
    interval: Annotated[float, typer.Option(min=0.0, help="Seconds between polls with --follow.")] = LIVE_POLL_SECONDS,
) -> None:
    """Print a batch's result lines (JSONL on stdout), the lines durable so far while it runs."""
    kinds = list(RESULT_KINDS) if kind is Kind.all else [kind.value]

    def body(client: ApiClient) -> None:
        offsets = dict.fromkeys(kinds, 0)
        while True:
            # The status first: once it is terminal, the reads that follow are of the finished files.
            batch = client.get(f"batches/{batch_id}")
            ended = batch.get("status") in TERMINAL
            for name in kinds:
                offsets[name] += _new_lines(client, batch_id, name, offsets[name])
            if ended or not follow:
                break
            time.sleep(interval)
        shown = ", ".join(f"{name} {offsets[name]} bytes" for name in kinds)
        say(f"{batch_id} {batch.get('status')}: {shown}" + ("" if ended else " so far"))

    run(body)


def retry(
    batch_id: BatchId,
    codes: Annotated[list[str] | None, typer.Option(help="Only records whose error has one of these codes "
                                                   "(comma-separated or repeated); default: every failure.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Sent as the Idempotency-Key header.")] = None,
    rejections_out: Annotated[
        str | None, typer.Option(help="Write every record the new create rejected (JSONL) here; '-' for stdout.")
    ] = None,
) -> None:
    """Make a new batch of the records of an ended batch that failed; print it like `batches create`."""
    chosen = [c.strip() for value in codes or [] for c in value.split(",") if c.strip()]
    request: dict[str, Any] = {"codes": chosen} if chosen else {}
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}

    def body(client: ApiClient) -> None:
        try:
            batch = client.post(f"batches/{batch_id}/retry", request, headers=headers)
        except ApiError as exc:
            if exc.code == "no_valid_records":  # every record taken was rejected by the create this time
                report_rejections(client, exc.error, rejections_out)
            if exc.code == "nothing_to_retry" and not chosen:
                raise _nothing_but_rejections(client, batch_id, exc) from None
            raise
        print_json(batch)
        say(f"retrying {plural(int(batch.get('retried_count') or 0), 'record')} of {batch_id} as {batch.get('id')}")
        report_rejections(client, batch, rejections_out)

    run(body)


def _nothing_but_rejections(client: ApiClient, batch_id: str, refusal: ApiError) -> ApiError:
    """``nothing_to_retry`` for a batch with failures: a retry without codes takes every record that ran and failed
    or never started, so each failure was a create rejection. Saying so, and where they are, beats "no records
    that ended in error" beside ``failed: N``."""
    batch = client.get(f"batches/{batch_id}")
    failed = int((batch.get("request_counts") or {}).get("failed") or 0)
    if failed == 0:
        return refusal
    held = [f"its rejections file {found}" for found in [_rejections_file_id(client, batch)] if found]
    held += [f"its error file {batch['error_file_id']}"] if batch.get("error_file_id") else []
    where = f"; they are in {' and in '.join(held)}" if held else ""
    them = "it" if failed == 1 else "them"
    return refusal.advised(
        f"batch {batch_id} has nothing to retry: its {plural(failed, 'failed record')} "
        f"{'was' if failed == 1 else 'were'} rejected at create, and a rejected record never runs, so a retry "
        f"never takes it; fix {them} in the input and create a new batch{where}")


def _rejections_file_id(client: ApiClient, batch: dict[str, Any]) -> str | None:
    """The create's rejections file of ``batch`` (``<batch id>_rejections.jsonl``, stored with the batch), which
    the batch object does not name. Files are listed newest first, so the search stops at the first file older
    than the batch."""
    name, created = f"{batch['id']}_rejections.jsonl", int(batch.get("created_at") or 0)
    params: dict[str, Any] = {"purpose": "batch_output", "limit": 1000}
    while True:
        page = client.get("files", params)
        files = page.get("data") or []
        for found in files:
            if found.get("filename") == name:
                return str(found["id"])
            if int(found.get("created_at") or 0) < created:
                return None
        if not files or not page.get("has_more"):
            return None
        params["after"] = files[-1]["id"]
