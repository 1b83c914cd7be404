"""The one whole-input refusal a single record can cause: ``openrelay.workflow``, which a batch does not run
(docs/api-contract.md §3: the create is refused, nothing is made)."""

from __future__ import annotations

from typing import Any

from ..errors import InputRefused
from .records import ParseFailure, parse_line

__all__ = ["carries_workflow", "refuse_if_workflow", "refuse_if_workflow_line"]


def carries_workflow(record: Any) -> bool:
    """Whether the record asks for ``openrelay.workflow`` (in ``body.openrelay`` or a top-level ``openrelay``)."""
    if not isinstance(record, dict):
        return False
    top = record.get("openrelay")
    if isinstance(top, dict) and "workflow" in top:
        return True
    body = record.get("body")
    if isinstance(body, dict):
        ext = body.get("openrelay")
        return isinstance(ext, dict) and "workflow" in ext
    return False


def refuse_if_workflow(line: int, record: Any) -> None:
    if carries_workflow(record):
        raise InputRefused(f"line {line}: openrelay.workflow is not supported in batch; nothing was created",
                           code="workflow_unsupported")


def refuse_if_workflow_line(line: int, raw: bytes) -> None:
    """As ``refuse_if_workflow``, for a line not parsed yet (one that does not parse asks for nothing)."""
    try:
        record = parse_line(raw)
    except ParseFailure:
        return
    refuse_if_workflow(line, record)
