"""The records a create rejected, for a person (a preview on stderr) and a script (``--rejections-out``): shared by
`orl batches create` and `orl batches retry`, whose new batch goes through the same create."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openrelay.cli.http import ApiClient, say
from openrelay.wording import plural

__all__ = ["PREVIEW_LIMIT", "rejection_preview", "report_rejections"]

PREVIEW_LIMIT = 10


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


def report_rejections(client: ApiClient, info: dict[str, Any], rejections_out: str | None) -> None:
    """Shared by the 200 (fields on the batch) and the 400 no_valid_records (fields on the error object)."""
    records = info.get("rejected_records") or []
    count = int(info.get("rejected_count") or len(records))
    file_id = info.get("rejected_records_file_id")
    if count > 0:
        say(f"rejected {plural(count, 'record')}:")
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
