"""One streaming pass over a batch's input: whole-input refusals first, then every record's verdict.

Each line is read (``records.read_record``) and judged (``rules.check_record``) the one way. Memory holds one
entry per record with a custom_id (its line, id, verdict and model: duplicates and the batch's model are known only
at the end), the rejections and, when asked, what the dispatch order needs of each accepted record
(``prefix.PrefixCollector``: its line, where its line lies in the stored input, its prompt's prefix hashes); never
the records themselves. Inline requests arrive as the raw bytes of each element of ``requests``, so they are
judged by the very same code as an input file's lines, with the same messages.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import msgspec

from ..catalog import Catalog
from ..errors import InputRefused
from ..prefix import LEVELS, PROMPT_FIELDS, PrefixCollector, prompt_reader
from ..types import Rejection
from .lines import Block, is_utf8, read_blocks
from .records import UNSET, NumberGate, ParseFailure, read_record
from .rules import WORKFLOW, check_record, cut_custom_id

__all__ = ["ScanResult", "scan_records", "file_lines", "inline_lines"]

DUPLICATE_MESSAGE = "custom_id appears more than once"
_INLINE_BLOCK = 4096  # inline requests copied out of the request body per block


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


def file_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[Block]:
    """Blocks of raw lines; blank lines still advance the count."""
    yield from read_blocks(handle, max_line_bytes)


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
    fields = PROMPT_FIELDS.get(endpoint, ()) if collect_prefixes else ()
    # The pass creates no reference cycles; without this, the cyclic collector re-walks the growing lists and
    # sets again and again (about a fifth of the create time at 50,000 records).
    paused = gc.isenabled()
    gc.disable()
    try:
        return _scan(source(), endpoint=endpoint, catalog=catalog, max_records=max_records, fields=fields)
    finally:
        if paused:
            gc.enable()


def _scan(blocks: Blocks, *, endpoint: str, catalog: Catalog, max_records: int,
          fields: tuple[str, ...]) -> ScanResult:
    result = ScanResult()
    rejections = result.rejections
    pending: list[tuple[int, str, str | None, str | None, str | None]] = []
    seen: set[str] = set()
    duplicates: set[str] = set()
    gate = NumberGate()
    prefixes = result.prefixes = PrefixCollector() if fields else None
    prompt_of = prompt_reader(fields)
    shortest = LEVELS[0]
    # A line shorter than this cannot hold a prompt of ``shortest`` bytes: what surrounds it takes the rest.
    long_line = shortest + len('{"custom_id":"","method":"POST","url":"","body":{"model":"",}}') + len(endpoint)
    total = 0
    for block in blocks:
        first = block.first
        suspects, ascii_block = gate.suspects(block) if total < max_records else (set(), True)
        skipped: list[int] = []  # the block's lines that are not records that pass (mostly none)
        collected = len(prefixes) if prefixes is not None else 0
        chained: list[int] = []  # the block's records with a prompt long enough to hash, and their prompts
        prompts: list[Any] = []
        for offset, raw in enumerate(block.lines):
            if not raw or raw.isspace():
                skipped.append(offset)
                continue
            total += 1
            line = first + offset
            past_cap = total > max_records
            # Past the cap only a workflow record can still change the answer: look for it cheaply. A key spelled
            # with \u escapes hides the plain word, so such lines are read too.
            if past_cap and b"workflow" not in raw and b"\\u" not in raw:
                continue
            try:
                # What msgspec's skipping leaves unchecked, UTF-8 and the range of numbers, is known for the block
                # at once (the gate runs below the cap): only a line that may hold either is parsed whole first.
                record = read_record(raw, whole=past_cap or offset in suspects
                                     or not (ascii_block or raw.isascii() or is_utf8(raw)))
            except ParseFailure as exc:
                if not past_cap:
                    rejections.append(Rejection(line=line, custom_id="", code="invalid_json", message=str(exc)))
                    skipped.append(offset)
                continue
            custom_id, code, message, model = check_record(record, endpoint=endpoint, catalog=catalog)
            if code == WORKFLOW:
                raise InputRefused(f"line {line}: {message}", code=code)
            if past_cap:
                continue
            if not custom_id:
                rejections.append(Rejection(line=line, custom_id="", code=code or "", message=message or ""))
                skipped.append(offset)
                continue
            if custom_id in seen:
                duplicates.add(custom_id)
            else:
                seen.add(custom_id)
            pending.append((line, custom_id, code, message, model))
            if code is not None:
                skipped.append(offset)
            elif prompt_of is not None and len(raw) >= long_line:
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
