"""`orl batches results` (a batch's result lines, while it runs too) and `orl batches retry` (a new batch of its
failures). Registered on `orl batches` by ``cli/main.py``."""

from __future__ import annotations

import sys
import time
from enum import StrEnum
from typing import Annotated, Any

import typer

from openrelay.cli.batches import BatchId, _report_rejections
from openrelay.cli.http import ApiClient, ApiError, print_json, run, say
from openrelay.config import LIVE_POLL_SECONDS
from openrelay.ids import RESULT_KINDS, result_file_id
from openrelay.types import TERMINAL

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
                _report_rejections(client, exc.error, rejections_out)
            raise
        print_json(batch)
        say(f"retrying {batch.get('retried_count')} record(s) of {batch_id} as {batch.get('id')}")
        _report_rejections(client, batch, rejections_out)

    run(body)
