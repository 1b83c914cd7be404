"""One streaming pass over a batch's input: whole-input refusals first, then every record's verdict.

Memory holds one entry per record with a custom_id (to find duplicates and the batch's model) and the
rejections; never the records themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..catalog import Catalog
from ..errors import InputRefused, StoreError
from ..types import Rejection
from .records import ParseFailure, carries_workflow, check_record, cut_custom_id, parse_line

__all__ = ["ScanResult", "scan_records", "file_lines", "inline_lines"]

DUPLICATE_MESSAGE = "custom_id appears more than once"


@dataclass(kw_only=True)
class ScanResult:
    total: int = 0
    model: str | None = None
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.total - len(self.rejections)


def file_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    """(line number, raw bytes) of every non-blank line; blank lines still advance the count."""
    number = 0
    while True:
        try:
            raw = handle.readline(max_line_bytes + 1)
        except (OSError, StoreError) as exc:
            raise InputRefused(f"the input could not be read after line {number}: {exc}",
                               code="input_unreadable") from exc
        if not raw:
            return
        number += 1
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            raise InputRefused(f"line {number} is longer than {max_line_bytes} bytes; the input cannot be read",
                               code="input_unreadable")
        if raw.strip():
            yield number, raw


def inline_lines(requests: list[Any]) -> Iterator[tuple[int, Any]]:
    """Inline requests are already parsed; wrap each so the scanner can tell them from raw bytes."""
    for position, request in enumerate(requests, 1):
        yield position, _Parsed(request)


@dataclass(frozen=True, slots=True)
class _Parsed:
    value: Any


def scan_records(lines: Iterable[tuple[int, Any]], *, endpoint: str, catalog: Catalog,
                 max_records: int) -> ScanResult:
    """Judge every record; raises InputRefused for workflow, too many records, or unreadable input."""
    result = ScanResult()
    pending: list[tuple[int, str, str | None, str | None, str | None]] = []
    seen: set[str] = set()
    duplicates: set[str] = set()
    for line, payload in lines:
        result.total += 1
        if result.total > max_records:
            # Past the cap only a workflow record can still change the answer: look for it cheaply.
            if _mentions_workflow(payload):
                try:
                    _refuse_if_workflow(line, _value(payload))
                except ParseFailure:
                    pass
            continue
        try:
            record = _value(payload)
        except ParseFailure as exc:
            result.rejections.append(Rejection(line=line, custom_id="", code="invalid_json", message=str(exc)))
            continue
        _refuse_if_workflow(line, record)
        verdict = check_record(record, endpoint=endpoint, catalog=catalog)
        if not verdict.custom_id:
            result.rejections.append(Rejection(line=line, custom_id="", code=verdict.code or "",
                                               message=verdict.message or ""))
            continue
        if verdict.custom_id in seen:
            duplicates.add(verdict.custom_id)
        else:
            seen.add(verdict.custom_id)
        pending.append((line, verdict.custom_id, verdict.code, verdict.message, verdict.model))
    if result.total > max_records:
        raise InputRefused(f"the input has {result.total:,} records; a batch takes at most {max_records:,}",
                           code="input_too_large")
    _settle(result, pending, duplicates)
    return result


def _settle(result: ScanResult, pending: list[tuple[int, str, str | None, str | None, str | None]],
            duplicates: set[str]) -> None:
    """Apply the two whole-input rules, then order rejections by line."""
    for line, custom_id, code, message, model in pending:
        if custom_id in duplicates:
            code, message = "duplicate_custom_id", DUPLICATE_MESSAGE
        elif code is None:
            if result.model is None:
                result.model = model
            elif model != result.model:
                code = "model_mismatch"
                message = f'model "{model}" differs from the batch\'s model "{result.model}"'
        if code is not None:
            result.rejections.append(Rejection(line=line, custom_id=cut_custom_id(custom_id), code=code,
                                               message=message or ""))
    result.rejections.sort(key=lambda r: r.line)


def _value(payload: Any) -> Any:
    return payload.value if isinstance(payload, _Parsed) else parse_line(payload)


def _mentions_workflow(payload: Any) -> bool:
    return isinstance(payload, _Parsed) or b"workflow" in payload


def _refuse_if_workflow(line: int, record: Any) -> None:
    if carries_workflow(record):
        raise InputRefused(f"line {line}: openrelay.workflow is not supported in batch; nothing was created",
                           code="workflow_unsupported")
