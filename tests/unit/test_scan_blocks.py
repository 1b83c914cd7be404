"""The create's scan reads its input a block of lines at a time. Whatever a block holds, the verdicts are those of
the whole parse (``test_record_readers.reference``), and the lines' places (offsets, lengths) are those of the
file."""

from __future__ import annotations

import orjson
import pytest

from openrelay.validation.lines import Block, read_blocks
from openrelay.validation.records import NumberGate
from openrelay.validation.scan import inline_lines, scan_records
from tests.unit.test_record_readers import CATALOG, EP, record, reference, scanned


def ordinary(count: int, prefix: str = "r", model: str = "m/chat") -> list[bytes]:
    return [orjson.dumps(record(f"{prefix}{i}", model=model)) for i in range(count)]


TWO_ON_ONE_LINE = orjson.dumps(record("x1")) + b" " + orjson.dumps(record("x2"))


@pytest.mark.parametrize("odd", [
    [],  # every line ordinary: the block is decoded in one call
    [b"", TWO_ON_ONE_LINE],  # a blank line and a line of two records
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


def test_a_custom_id_twice_rejects_both_records_and_no_other(tmp_path):
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
