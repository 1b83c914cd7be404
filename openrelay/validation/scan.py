"""One streaming pass over a batch's input: every record read (``records``) and judged (``rules``), then the two
whole-input rules. Memory holds an entry per record with a custom_id, the rejections and, when asked, what the
dispatch order needs (``prefix.PrefixCollector``); never the records. Inline requests come as the raw bytes of
each element of ``requests``, judged by the very same code as an input file's lines."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..catalog import Catalog
from ..errors import InputRefused
from ..prefix import LEVELS, PROMPT_FIELDS, PrefixCollector, prompt_reader
from ..types import Rejection
from .lines import Block, is_utf8, read_blocks
from .records import UNSET, NumberGate, ParseFailure, decode_lines, read_record
from .rules import WORKFLOW, check_record, cut_custom_id

__all__ = ["ScanResult", "scan_records", "file_lines", "inline_lines"]

DUPLICATE_MESSAGE = "custom_id appears more than once"
_INLINE_BLOCK = 4096  # inline requests copied out of the request body per block
BLANK = object()  # what a blank line reads as (JSON's null is None)


@dataclass(kw_only=True)
class ScanResult:
    total: int = 0
    model: str | None = None
    rejections: list[Rejection] = field(default_factory=list)
    prefixes: PrefixCollector | None = None  # with ``collect_prefixes``: every accepted record, and some rejected

    @property
    def accepted(self) -> int:
        return self.total - len(self.rejections)


Blocks = Iterable[Block]
file_lines = read_blocks  # an input file's blocks of lines; blank lines still advance the count


def inline_lines(requests: Sequence[msgspec.Raw | bytes]) -> Iterator[Block]:
    """The raw bytes of each inline request (``msgspec.Raw`` slices of the body); its line is its position."""
    for start in range(0, len(requests), _INLINE_BLOCK):
        yield Block.of_lines(start + 1, [bytes(r) for r in requests[start:start + _INLINE_BLOCK]])


def scan_records(source: Callable[[], Blocks], *, endpoint: str, catalog: Catalog, max_records: int,
                 collect_prefixes: bool = False) -> ScanResult:
    """Judge every record; raises InputRefused for workflow, too many records, or unreadable input.

    ``source`` opens the input (a call, one pass). ``collect_prefixes``: gather ``result.prefixes`` too, for the
    order records are dispatched in (an endpoint without prompt fields has none); offsets count from the input's
    first line.
    """
    # The pass creates no reference cycles; without this, the cyclic collector re-walks the growing lists and
    # sets again and again (about a fifth of the create time at 50,000 records).
    paused = gc.isenabled()
    gc.disable()
    try:
        return _scan(source(), endpoint, catalog, max_records,
                     PROMPT_FIELDS.get(endpoint, ()) if collect_prefixes else ())
    finally:
        if paused:
            gc.enable()


def _scan(blocks: Blocks, endpoint: str, catalog: Catalog, max_records: int, fields: tuple[str, ...]) -> ScanResult:
    result = ScanResult()
    rejections = result.rejections
    pending: list[tuple[int, str, str | None, str | None, str | None]] = []
    seen: set[str] = set()
    duplicates: set[str] = set()
    gate = NumberGate()
    prefixes = result.prefixes = PrefixCollector() if fields else None
    prompt_of = prompt_reader(fields)
    shortest = LEVELS[0]
    total = 0
    for block in blocks:
        first = block.first
        suspects, ascii_block = gate.suspects(block)
        skipped: list[int] = []  # the block's lines that are not records that pass (mostly none)
        collected = len(prefixes) if prefixes is not None else 0
        chained: list[int] = []  # the block's records with a prompt long enough to hash, and their prompts
        prompts: list[Any] = []
        records = _read_block(block) if ascii_block and not suspects else None
        for offset, record in enumerate(records) if records is not None else _read_lines(block, suspects,
                                                                                           ascii_block):
            if record is BLANK:
                skipped.append(offset)
                continue
            total += 1
            custom_id, code, message, model = check_record(record, endpoint, catalog)
            if code == WORKFLOW:
                raise InputRefused(f"line {first + offset}: {message}", code=code)
            if total > max_records:  # past the cap only a workflow record can still change the answer
                continue
            if not custom_id:
                rejections.append(Rejection(line=first + offset, custom_id="", code=code or "",
                                            message=message or ""))
                skipped.append(offset)
                continue
            if custom_id in seen:
                duplicates.add(custom_id)
            else:
                seen.add(custom_id)
            pending.append((first + offset, custom_id, code, message, model))
            if code is not None:
                skipped.append(offset)
            elif prompt_of is not None:
                material = prompt_of(record.body)
                if material is not UNSET and len(material) >= shortest:
                    chained.append(collected + offset - len(skipped))
                    prompts.append(material)
        if prefixes is not None:
            prefixes.add_block(first, block.lengths(), skipped)
            prefixes.add_chains(chained, prompts)
    result.total = total
    if total > max_records:
        raise InputRefused(f"the input has {total:,} records; a batch takes at most {max_records:,}",
                           code="input_too_large")
    _apply_whole_input_rules(result, pending, duplicates)
    return result


def _read_block(block: Block) -> list[Any] | None:
    """Every line of an ASCII block with no number out of range, read in one call (no line copied), or None when
    one holds no object. ``decode_lines`` skips blank lines and reads two values on one line: hence the checks."""
    if not block.every_line_opens():
        return None
    try:
        records = decode_lines(block.data)
    except (msgspec.DecodeError, RecursionError):
        return None
    return records if len(records) == block.count else None


def _read_lines(block: Block, suspects: set[int], ascii_block: bool) -> Iterator[tuple[int, Any]]:
    """(offset, record) of each line: ``BLANK`` for a blank line, else ``read_record``'s record or its ParseFailure;
    only a line that may hold invalid UTF-8 or a number out of range is parsed whole first."""
    for offset, raw in enumerate(block.lines):
        if not raw or raw.isspace():
            yield offset, BLANK
            continue
        try:
            record = read_record(raw, whole=offset in suspects or not (ascii_block or raw.isascii() or is_utf8(raw)))
        except ParseFailure as exc:
            record = exc
        yield offset, record


def _apply_whole_input_rules(result: ScanResult, pending: list[tuple[int, str, str | None, str | None, str | None]],
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
