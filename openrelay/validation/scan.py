"""One streaming pass over a batch's input: whole-input refusals first, then every record's verdict.

Memory holds one entry per record with a custom_id (to find duplicates and the batch's model) and the
rejections; never the records themselves. The common record (well-formed, no extensions, an offered model) is
accepted by an inlined fast path; anything else goes through ``check_record``, which decides the exact code.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import orjson

from ..catalog import Catalog
from ..errors import InputRefused
from ..types import Rejection
from .lines import read_blocks
from .records import ParseFailure, carries_workflow, check_record, cut_custom_id, parse_line

__all__ = ["ScanResult", "scan_records", "file_lines", "inline_lines"]

DUPLICATE_MESSAGE = "custom_id appears more than once"
_PARSED = object()  # marks a block whose items are already-parsed inline requests


@dataclass(kw_only=True)
class ScanResult:
    total: int = 0
    model: str | None = None
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.total - len(self.rejections)


Blocks = Iterable[tuple[int, list[Any], object | None]]


def file_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, list[Any], object | None]]:
    """Blocks of raw lines; blank lines still advance the count."""
    for first, block in read_blocks(handle, max_line_bytes):
        yield first, block, None


def inline_lines(requests: list[Any]) -> Iterator[tuple[int, list[Any], object | None]]:
    """Inline requests are already parsed; their line is their position in ``requests``."""
    yield 1, requests, _PARSED


def scan_records(blocks: Blocks, *, endpoint: str, catalog: Catalog, max_records: int) -> ScanResult:
    """Judge every record; raises InputRefused for workflow, too many records, or unreadable input."""
    # The pass keeps one small tuple per record and creates no reference cycles; without this, the cyclic
    # collector re-walks the growing list again and again (about a fifth of the create time at 50,000 records).
    paused = gc.isenabled()
    gc.disable()
    try:
        return _scan(blocks, endpoint=endpoint, catalog=catalog, max_records=max_records)
    finally:
        if paused:
            gc.enable()


def _scan(blocks: Blocks, *, endpoint: str, catalog: Catalog, max_records: int) -> ScanResult:
    result = ScanResult()
    rejections = result.rejections
    pending: list[tuple[int, str, str | None, str | None, str | None]] = []
    seen: set[str] = set()
    duplicates: set[str] = set()
    offered = frozenset(name for name, spec in catalog.models.items() if endpoint in spec.endpoints)
    total = 0
    for first, block, kind in blocks:
        parsed = kind is _PARSED
        for offset, raw in enumerate(block):
            if not parsed and (not raw or raw.isspace()):
                continue
            line = first + offset
            total += 1
            if total > max_records:
                # Past the cap only a workflow record can still change the answer: look for it cheaply. A key
                # spelled with \u escapes hides the plain word, so such lines are parsed too.
                if parsed or b"workflow" in raw or b"\\u" in raw:
                    _refuse_if_workflow_line(line, raw, parsed)
                continue
            if parsed:
                record = raw
            else:
                try:
                    record = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    try:
                        record = parse_line(raw)
                    except ParseFailure as exc:
                        rejections.append(Rejection(line=line, custom_id="", code="invalid_json", message=str(exc)))
                        continue
            # Fast path: the shape almost every record has. Any doubt falls through to check_record.
            if type(record) is dict and "openrelay" not in record and "tool_config" not in record:
                body = record.get("body")
                custom_id = record.get("custom_id")
                if (type(body) is dict and type(custom_id) is str and custom_id
                        and record.get("method") == "POST" and record.get("url") == endpoint
                        and "openrelay" not in body and "tool_config" not in body
                        and body.get("stream") is not True and body.get("model") in offered):
                    if custom_id in seen:
                        duplicates.add(custom_id)
                    else:
                        seen.add(custom_id)
                    pending.append((line, custom_id, None, None, body["model"]))
                    continue
            _refuse_if_workflow(line, record)
            verdict = check_record(record, endpoint=endpoint, catalog=catalog)
            if not verdict.custom_id:
                rejections.append(Rejection(line=line, custom_id="", code=verdict.code or "",
                                            message=verdict.message or ""))
                continue
            if verdict.custom_id in seen:
                duplicates.add(verdict.custom_id)
            else:
                seen.add(verdict.custom_id)
            pending.append((line, verdict.custom_id, verdict.code, verdict.message, verdict.model))
    result.total = total
    if total > max_records:
        raise InputRefused(f"the input has {total:,} records; a batch takes at most {max_records:,}",
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


def _refuse_if_workflow_line(line: int, raw: Any, parsed: bool) -> None:
    try:
        record = raw if parsed else parse_line(raw)
    except ParseFailure:
        return
    _refuse_if_workflow(line, record)


def _refuse_if_workflow(line: int, record: Any) -> None:
    if carries_workflow(record):
        raise InputRefused(f"line {line}: openrelay.workflow is not supported in batch; nothing was created",
                           code="workflow_unsupported")
