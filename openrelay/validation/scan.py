"""One streaming pass over a batch's input: whole-input refusals first, then every record's verdict.

Memory holds one entry per record with a custom_id (to find duplicates: an 8-byte hash in the first pass, the
id itself in the full pass, which also keeps its line and model), the rejections and, when asked, what the
dispatch order needs of each accepted record (``prefix.PrefixCollector``: its line, where its line lies in the
stored input, its prompt's prefix hashes); never the records themselves.
The common record (well-formed, no extensions, an offered model) is accepted by an inlined fast path; anything
else goes through ``check_record``, which decides the exact code. Inline requests arrive as the raw bytes of
each element of ``requests``, so they are judged by the very same code as an input file's lines, with the same
messages.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, BinaryIO

import msgspec
import numpy as np
import orjson

from ..catalog import Catalog
from ..errors import InputRefused
from ..prefix import LEVELS, PROMPT_FIELDS, PrefixCollector, prompt_reader
from ..types import Rejection
from .lines import Block, is_utf8, read_blocks
from .records import (
    NumberGate,
    ParseFailure,
    check_record,
    cut_custom_id,
    decode_ordinary,
    decode_prompt,
    decode_whole,
    parse_line,
)
from .workflow import refuse_if_workflow, refuse_if_workflow_line

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


class _NeedsFullPass(Exception):
    """The quick pass met a duplicate custom_id or a second model: which records those rules reject depends on
    every record's line and model, which the quick pass does not keep."""


def scan_records(source: Callable[[], Blocks], *, endpoint: str, catalog: Catalog, max_records: int,
                 collect_prefixes: bool = False) -> ScanResult:
    """Judge every record; raises InputRefused for workflow, too many records, or unreadable input.

    ``source`` opens the input afresh each call. The first pass keeps only a hash of each custom_id (``hash``, a
    machine word: no string outlives its block); an input with two equal hashes (a duplicate, or rarely two ids
    that hash alike) or a second model is read again by a pass that keeps each record's line, custom_id and model.
    ``collect_prefixes``: gather ``result.prefixes`` too, for the order records are dispatched in (an endpoint
    without prompt fields has none); offsets count from the input's first line.
    """
    fields = PROMPT_FIELDS.get(endpoint, ()) if collect_prefixes else ()
    # Neither pass creates reference cycles; without this, the cyclic collector re-walks the growing lists and
    # sets again and again (about a fifth of the create time at 50,000 records, when the first pass kept a set).
    paused = gc.isenabled()
    gc.disable()
    try:
        try:
            return _scan(source(), endpoint=endpoint, catalog=catalog, max_records=max_records, keep=False,
                         fields=fields)
        except _NeedsFullPass:
            return _scan(source(), endpoint=endpoint, catalog=catalog, max_records=max_records, keep=True,
                         fields=fields)
    finally:
        if paused:
            gc.enable()


def _scan(blocks: Blocks, *, endpoint: str, catalog: Catalog, max_records: int, keep: bool,
          fields: tuple[str, ...]) -> ScanResult:
    result = ScanResult()
    rejections = result.rejections
    pending: list[tuple[int, str, str | None, str | None, str | None]] = []
    seen: set[str] = set()  # the full pass's custom_ids
    duplicates: set[str] = set()
    id_hashes: list[np.ndarray] = []  # the first pass's: the hash of each custom_id, a block at a time
    offered = frozenset(name for name, spec in catalog.models.items() if endpoint in spec.endpoints)
    gate = NumberGate()
    decoder = decode_ordinary(endpoint, offered, fields)
    decode = decoder.decode
    # A block whose lines are all too short to hold a prompt worth hashing is decoded without its prompt fields
    # (skipped, as the rest of the body is): the same records pass.
    promptless = decode_ordinary(endpoint, offered) if fields else decoder
    prefixes = result.prefixes = PrefixCollector() if fields else None
    prompt_of = prompt_reader(fields)
    shortest = LEVELS[0]
    # A line shorter than this cannot hold a prompt of ``shortest`` bytes: what surrounds it takes the rest.
    long_line = shortest + len('{"custom_id":"","method":"POST","url":"","body":{"model":"",}}') + len(endpoint)
    batch_model: str | None = None  # the first pass's: the model of every record it accepted
    total = 0
    for block in blocks:
        first = block.first
        suspects, ascii_block = gate.suspects(block) if total < max_records else (set(), True)
        skipped: list[int] = []  # the block's lines that are not records that pass (mostly none)
        ids: list[str] = []  # the first pass's custom_ids met line by line (records that pass, and rejected ones)
        collected = len(prefixes) if prefixes is not None else 0
        chained: list[int] = []  # the block's records with a prompt long enough to hash, and their prompts
        prompts: list[Any] = []
        plain = ascii_block and not suspects  # every line of the block may take the fast path as it is
        # Fastest path: the whole block decoded at once, when every line of it is an ordinary record.
        shapes = None
        if plain and total + block.count <= max_records:
            long_lines = np.flatnonzero(block.lengths() >= long_line) if prompt_of is not None else _NO_LINES
            shapes = _ordinary_block(decoder if len(long_lines) else promptless, block)
        if shapes is not None:
            total += len(shapes)
            if keep:
                for offset, shape in enumerate(shapes):
                    custom_id = shape.custom_id
                    if custom_id in seen:
                        duplicates.add(custom_id)
                    else:
                        seen.add(custom_id)
                    pending.append((first + offset, custom_id, None, None, shape.body.model))
            else:
                id_hashes.append(np.fromiter(map(_id_hash, map(_CUSTOM_ID, shapes)), np.int64, len(shapes)))
                # With one model offered, every ordinary record names it (its type is that one name).
                for model in (shapes[0].body.model,) if len(offered) == 1 else set(map(_MODEL, shapes)):
                    if model is not batch_model:
                        if batch_model is not None:
                            raise _NeedsFullPass
                        batch_model = model
            if prompt_of is not None:
                for offset in long_lines.tolist():
                    material = prompt_of(shapes[offset].body)
                    if material is not _UNSET and len(material) >= shortest:
                        chained.append(collected + offset)
                        prompts.append(material)
        for offset, raw in enumerate(block.lines if shapes is None else ()):  # line by line, unless judged above
            if total >= max_records:
                # Past the cap only a workflow record can still change the answer: look for it cheaply. A key
                # spelled with \u escapes hides the plain word, so such lines are parsed too.
                if raw and not raw.isspace():
                    total += 1
                    if b"workflow" in raw or b"\\u" in raw:
                        refuse_if_workflow_line(first + offset, raw)
                continue
            # Fast path: msgspec decodes the record into a struct of its four fields and of the body's fields the
            # rules need, skipping the rest (still checking its syntax). What skipping does not check, UTF-8 and
            # the range of numbers, is checked for the whole block at once; a line that may hold a number out of
            # range (records.NumberGate) is read whole first. A blank line fails to decode.
            if plain or ((ascii_block or raw.isascii() or is_utf8(raw))
                         and not (offset in suspects and not _reads_whole(raw))):
                try:
                    shape = decode(raw)
                except (msgspec.DecodeError, RecursionError):
                    shape = None
                if shape is not None:  # it passes every rule of its own (records.decode_ordinary)
                    total += 1
                    custom_id = shape.custom_id
                    model = shape.body.model
                    if keep:
                        if custom_id in seen:
                            duplicates.add(custom_id)
                        else:
                            seen.add(custom_id)
                        pending.append((first + offset, custom_id, None, None, model))
                    else:
                        ids.append(custom_id)  # hashed at the block's end
                        if model is not batch_model:  # the model names come interned
                            if batch_model is not None:
                                raise _NeedsFullPass
                            batch_model = model
                    if prompt_of is not None and len(raw) >= long_line:
                        material = prompt_of(shape.body)
                        if material is not _UNSET and len(material) >= shortest:
                            chained.append(collected + offset - len(skipped))
                            prompts.append(material)
                    continue
            if not raw or raw.isspace():
                skipped.append(offset)
                continue
            total += 1
            line = first + offset
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                try:
                    record = parse_line(raw)
                except ParseFailure as exc:
                    rejections.append(Rejection(line=line, custom_id="", code="invalid_json", message=str(exc)))
                    skipped.append(offset)
                    continue
            refuse_if_workflow(line, record)
            verdict = check_record(record, endpoint=endpoint, catalog=catalog)
            if not verdict.custom_id:
                rejections.append(Rejection(line=line, custom_id="", code=verdict.code or "",
                                            message=verdict.message or ""))
                skipped.append(offset)
                continue
            if not keep:
                if verdict.code is None:
                    raise _NeedsFullPass  # an accepted record off the fast path: let the full pass place its model
                ids.append(verdict.custom_id)
            elif verdict.custom_id in seen:
                duplicates.add(verdict.custom_id)
            else:
                seen.add(verdict.custom_id)
            pending.append((line, verdict.custom_id, verdict.code, verdict.message, verdict.model))
            if verdict.code is not None:
                skipped.append(offset)
            elif prefixes is not None:
                material = decode_prompt(raw, fields)
                if material is not None and len(material) >= shortest:
                    chained.append(collected + offset - len(skipped))
                    prompts.append(material)
        if ids:
            id_hashes.append(np.fromiter(map(_id_hash, ids), np.int64, len(ids)))
        if prefixes is not None:
            prefixes.add_block(first, block.lengths(), skipped)
            prefixes.add_chains(chained, prompts)
    result.total = total
    if total > max_records:
        raise InputRefused(f"the input has {total:,} records; a batch takes at most {max_records:,}",
                           code="input_too_large")
    if _repeats(id_hashes):
        raise _NeedsFullPass  # a custom_id seen twice (or two that hash alike): the full pass tells which
    result.model = batch_model
    _apply_whole_input_rules(result, pending, duplicates)
    return result


_UNSET = msgspec.UNSET
_id_hash = hash  # of a custom_id, for the first pass (a name of its own, so a test can make every id collide)
_NO_LINES = np.zeros(0, np.intp)
_CUSTOM_ID = attrgetter("custom_id")
_MODEL = attrgetter("body.model")


def _repeats(hashes: list[np.ndarray]) -> bool:
    """Whether a value appears twice among ``hashes``."""
    if not hashes:
        return False
    every = np.sort(np.concatenate(hashes))
    return bool((every[1:] == every[:-1]).any())


def _ordinary_block(decoder: Any, block: Block) -> list[Any] | None:
    """Every line of ``block`` decoded as an ordinary record, in one call, or None when one of them is not one.
    ``decode_lines`` skips blank lines and reads two values on one line: so only a block whose every line begins
    with a character other than whitespace (``Block.every_line_opens``) is decoded so, and one value a line is
    checked by the count."""
    if not block.every_line_opens():
        return None
    try:
        shapes = decoder.decode_lines(block.data)
    except (msgspec.DecodeError, RecursionError):
        return None
    return shapes if len(shapes) == block.count else None


def _reads_whole(raw: bytes) -> bool:
    """Whether the ordinary record on a line the number gate picked can be read whole (every number decoded,
    so checked). When not, the full rules say why."""
    try:
        decode_whole(raw)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


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
