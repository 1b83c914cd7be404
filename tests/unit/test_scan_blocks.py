"""The create's fastest path: a block of lines decoded in one call (``scan._ordinary_block``) when every line of it
is an ordinary record. Whatever a block holds, the verdicts are the full rules' (``test_scan_fast_path.reference``),
and the lines' places (offsets, lengths) are those of the file."""

from __future__ import annotations

import orjson
import pytest

from openrelay.validation import lines as lines_module
from openrelay.validation import scan
from openrelay.validation.lines import Block, read_blocks
from openrelay.validation.records import NumberGate
from openrelay.validation.scan import inline_lines, scan_records
from tests.unit.test_scan_fast_path import CATALOG, EP, record, reference, scanned


def ordinary(count: int, prefix: str = "r", model: str = "m/chat") -> list[bytes]:
    return [orjson.dumps(record(f"{prefix}{i}", model=model)) for i in range(count)]


TWO_ON_ONE_LINE = orjson.dumps(record("x1")) + b" " + orjson.dumps(record("x2"))


@pytest.mark.parametrize("odd", [
    [],  # every line ordinary: the block is decoded in one call
    [b"", TWO_ON_ONE_LINE],  # a blank line and a line of two records: as many values as lines
    [b"   ", TWO_ON_ONE_LINE],  # a line of spaces instead
    [b"\t\r", TWO_ON_ONE_LINE],
    [b" " + orjson.dumps(record("leading-space"))],  # an ordinary record after a space: accepted
    [orjson.dumps(record("bad-model", model="nope"))],
    [orjson.dumps(record("r3"))],  # a duplicate custom_id
    [orjson.dumps(record("r150", model="nope"))],  # a rejected record's custom_id, the same as a later one's
    [orjson.dumps(record("other", model="m/other"))],  # a second model
    [b"\xff"],
])
def test_one_odd_line_in_a_block_is_judged_as_the_full_rules_judge_it(odd, tmp_path):
    lines = ordinary(200)
    lines[100:100] = odd
    assert scanned(lines, tmp_path) == reference(lines)


def test_crlf_lines_and_a_file_that_ends_in_blank_lines(tmp_path):
    lines = [line + b"\r" for line in ordinary(50)] + [b"", b""]
    assert scanned(lines, tmp_path) == reference(lines) == ("m/chat", [])


def test_blocks_of_many_megabytes_with_duplicates_and_models_across_blocks(tmp_path):
    lines = ordinary(30_000)  # about 5 MB: lines cut by the 1 MB reads are carried to the next block
    lines[25_000] = orjson.dumps(record("r7"))  # the same custom_id four blocks later
    lines[29_000] = orjson.dumps(record("late", model="m/other"))
    assert scanned(lines, tmp_path) == reference(lines)
    assert scanned(lines[:20_000], tmp_path) == ("m/chat", [])


def test_custom_ids_that_hash_alike_are_told_apart_by_the_full_pass(tmp_path, monkeypatch):
    """The first pass keeps only a hash of each custom_id: equal hashes send the input to the full pass, which
    compares the ids themselves, so ids that merely hash alike are no duplicates."""
    monkeypatch.setattr(scan, "_id_hash", lambda _custom_id: 7)  # every id collides with every other
    lines = ordinary(3_000)
    assert scanned(lines, tmp_path) == reference(lines) == ("m/chat", [])
    lines[2_500] = orjson.dumps(record("r12"))
    assert scanned(lines, tmp_path) == reference(lines)
    assert [r[:3] for r in reference(lines)[1]] == [(13, "r12", "duplicate_custom_id"),
                                                     (2_501, "r12", "duplicate_custom_id")]


def test_every_line_keeps_its_place_in_the_file(tmp_path):
    lines = ordinary(12_000) + [b"", b"  "] + ordinary(3_000, "s")
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with open(path, "rb") as handle:
        blocks = list(read_blocks(handle, 1 << 20))
    assert len(blocks) > 1
    assert [raw for block in blocks for raw in block.lines] == lines
    assert [block.first for block in blocks] == [1 + sum(b.count for b in blocks[:i]) for i in range(len(blocks))]
    for block in blocks:
        assert block.lengths().tolist() == [len(raw) for raw in block.lines]


def test_inline_requests_with_newlines_of_their_own():
    raws = [orjson.dumps(record(f"i{i}")) for i in range(10)]
    raws[4] = orjson.dumps(record("i4"), option=orjson.OPT_INDENT_2)  # a request over several lines
    result = scan_records(lambda: inline_lines(raws), endpoint=EP, catalog=CATALOG, max_records=100)
    assert (result.total, result.rejections, result.model) == (10, [], "m/chat")


@pytest.mark.parametrize(("tail", "suspect"), [
    (b"1e", False), (b"1e4", False), (b"1e+4", False), (b"1e40", False), (b"1e+40", False), (b"1e400", True),
    (b"1E-999", True), (b"9" * 211, True),
])
def test_the_number_gate_reads_a_block_to_its_last_byte(tail, suspect):
    """A pattern at the very end of a block is judged on the bytes there are (nothing past the block is read as a
    digit): the last line is a suspect exactly when it ends in an exponent of three digits or a long run."""
    gate = NumberGate()
    for data in (tail, b'{"a":1}\n' + tail, b"x" * 1000 + b"\n" + tail):
        block = Block(1, data)
        assert gate.suspects(block) == (({block.count - 1} if suspect else set()), True), data[-20:]


@pytest.mark.parametrize("short", [b"", b"  ", b"x" * 30])
def test_lines_long_then_short_keep_their_places(short, tmp_path, monkeypatch):
    """After a block of long lines the next block's newlines are looked for one by one; a block of short lines
    there goes back to numpy's marks, and every line keeps its place either way."""
    find, found = lines_module._find_newlines, []
    monkeypatch.setattr(lines_module, "_find_newlines", lambda data: found.append(find(data)) or found[-1])
    lines = [b"y" * (3_000 + i % 5) for i in range(800)] + [short] * 60_000 + [b"z" * 2_500] * 900
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with open(path, "rb") as handle:
        blocks = list(read_blocks(handle, 1 << 20))
    assert any(f is None for f in found) and any(f is not None for f in found)  # both ways were taken
    assert [raw for block in blocks for raw in block.lines] == lines
    for block in blocks:
        assert block.newlines().tolist() == [i for i, byte in enumerate(block.data) if byte == 10]
        assert block.lengths().tolist() == [len(raw) for raw in block.lines]
