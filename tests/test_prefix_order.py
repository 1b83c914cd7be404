"""The create's dispatch order (issue 20 part 1): prefix chains computed during the scan, the order records that
share a prompt prefix go out in (adjacent, largest groups first), and the blob it is stored as beside the batch.

Unit tests read real record bytes through ``openrelay.prefix`` and the scan; the others create batches on a real
``orl serve`` (API only, so no run touches the batch) and read the blob back against the stored input.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from openrelay.catalog import parse_catalog
from openrelay.prefix import (
    ENTRY,
    LEVELS,
    DispatchEntry,
    DispatchOrder,
    PrefixCollector,
    chain_hashes,
    read_entries,
)
from openrelay.validation.scan import file_lines, inline_lines, scan_records
from tests.support.batches import CHAT, EMBEDDINGS, embed, jsonl, post_batch, upload
from tests.support.server import TEST_CATALOG, Server, catalog_text

CATALOG = parse_catalog("""
[[models]]
name = "m/chat"
endpoints = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }
""")
BOM = b"\xef\xbb\xbf"
RANGE = "json: cannot unmarshal number 1e400 into Go value of type float64"


def prefix_chain(material: bytes) -> list[int]:
    """The 64-bit hash of each ``LEVELS`` prefix of ``material`` that it is long enough to have."""
    collector = PrefixCollector()
    if len(material) >= LEVELS[0]:
        collector.add_chains([0], [material])
    return chain_hashes(collector.depths, collector.crcs).tolist()


def entries_of(order: DispatchOrder, base: int = 0) -> list[DispatchEntry]:
    """The entries of the blob the order is stored as, read back as a worker reads them."""
    return list(read_entries(io.BytesIO(order.encoded(base))))


def system_prompt(topic: str, rules: int) -> str:
    return " ".join(f"Rule {n} for {topic}: quote every figure exactly and say where it is written."
                    for n in range(rules))


# Three system prompts of different lengths (about 0.6, 1.5 and 4 KB) and records that share them, in groups of
# different sizes; a few records share nothing.
SYSTEMS = {"small": system_prompt("memos", 8), "mid": system_prompt("contracts", 20),
           "big": system_prompt("audits", 50)}
GROUP_SIZES = {"big": 5, "mid": 9, "small": 3}


def chat_record(custom_id: str, system: str | None, question: str, model: str = "test/echo") -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "max_tokens": 8, "messages": messages}}


def shuffled_records(model: str = "test/echo", seed: int = 20) -> list[dict[str, Any]]:
    records = [chat_record(f"{name}-{i}", SYSTEMS[name], f"Question {i} about the {name} file?", model)
               for name, size in GROUP_SIZES.items() for i in range(size)]
    records += [chat_record(f"alone-{i}", None, f"A question of its own, number {i}. " * 12, model)
                for i in range(4)]
    random.Random(seed).shuffle(records)
    return records


def group_of(custom_id: str) -> str:
    return custom_id.split("-")[0]


def runs(values: list[str]) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for value in values:
        if found and found[-1][0] == value:
            found[-1] = (value, found[-1][1] + 1)
        else:
            found.append((value, 1))
    return found


def scanned(content: bytes, tmp_path: Path, endpoint: str = CHAT):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)

    def source():
        with open(path, "rb") as handle:
            yield from file_lines(handle, 1 << 20)

    return scan_records(source, endpoint=endpoint, catalog=CATALOG, max_records=1000, collect_prefixes=True)


# -- openrelay.prefix and the scan, on real bytes -------------------------------------------------------------------


def test_chain_hashes_follow_the_prefix_and_do_not_change_between_processes():
    material = orjson.dumps(chat_record("a", SYSTEMS["big"], "q")["body"]["messages"])
    chain = prefix_chain(material)
    assert len(chain) == sum(1 for level in LEVELS if level <= len(material))
    longer = prefix_chain(material[:LEVELS[1]] + b"x" * 2000)  # the same first 512 bytes, then others
    assert longer[:2] == chain[:2] and longer[2] != chain[2]
    assert prefix_chain(material[:LEVELS[0] - 1]) == []
    assert all(0 < h < 2 ** 64 for h in chain)
    # Python's hash() differs from one process to the next; these must not.
    script = f"from tests.test_prefix_order import prefix_chain; print(prefix_chain({material!r}))"
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, cwd=Path(__file__).resolve().parents[1])
        assert out.stdout.strip() == str(chain)


def test_records_sharing_a_prefix_are_adjacent_largest_group_first(tmp_path):
    records = shuffled_records(model="m/chat")
    result = scanned(jsonl(*records), tmp_path)
    assert result.rejections == []
    order = result.prefixes.order()
    entries = entries_of(order)
    assert sorted(e.line for e in entries) == list(range(1, len(records) + 1))  # every record once
    named = [group_of(records[e.line - 1]["custom_id"]) for e in entries]
    # Largest group first (mid: 9, big: 5, small: 3), each group in one run; records alone last, in input order.
    assert runs(named) == [("mid", 9), ("big", 5), ("small", 3), ("alone", 4)]
    alone = [e.line for e in entries if named[entries.index(e)] == "alone"]
    assert alone == sorted(alone)
    for name in ("mid", "big", "small"):
        members = [e for e, n in zip(entries, named, strict=True) if n == name]
        assert len({e.group for e in members}) == 1 and members[0].group != 0
        material = len(orjson.dumps(records[members[0].line - 1]["body"]["messages"]))
        shared = max(level for level in LEVELS if level <= len(orjson.dumps([{"role": "system",
                                                                              "content": SYSTEMS[name]}])))
        assert members[0].shared_bytes == shared <= material
        assert [e.line for e in members] == sorted(e.line for e in members)  # input order inside a group
    assert all(e.group == 0 and e.shared_bytes == 0 for e, n in zip(entries, named, strict=True) if n == "alone")
    # Reuse: every record of a group but its first finds the group's prefix.
    assert order.reusable_bytes() == sum(
        (GROUP_SIZES[name] - 1) * next(e.shared_bytes for e, n in zip(entries, named, strict=True) if n == name)
        for name in GROUP_SIZES)


def test_a_group_inside_a_group_goes_first_then_the_rest_of_the_outer_group(tmp_path):
    system = SYSTEMS["mid"]
    document = " ".join(f"clause {i} binds the parties" for i in range(120))
    records = [chat_record(f"doc-{i}", system, document + f" Question {i}?", "m/chat") for i in range(3)]
    records += [chat_record(f"sys-{i}", system, f"A short question {i}?", "m/chat") for i in range(6)]
    random.Random(3).shuffle(records)
    entries = entries_of(scanned(jsonl(*records), tmp_path).prefixes.order())
    named = [records[e.line - 1]["custom_id"].split("-")[0] for e in entries]
    assert runs(named) == [("doc", 3), ("sys", 6)]  # the deeper group first, inside the system prompt's group
    doc, sys_only = entries[0], entries[3]
    assert doc.shared_bytes > sys_only.shared_bytes and doc.group != sys_only.group


def test_offsets_and_lengths_are_the_lines_of_the_stored_file(tmp_path):
    records = shuffled_records(model="m/chat")
    lines = [orjson.dumps(r) for r in records]
    # A byte order mark, blank lines, CRLF endings and a rejected record: offsets still land on each line.
    content = BOM + b"\n".join(lines[:5]) + b"\n\n  \n" + b"\r\n".join(lines[5:10]) + b"\r\n" + \
        b'{"custom_id":"bad","method":"GET"}\n' + b"\n".join(lines[10:])
    result = scanned(content, tmp_path)
    assert [(r.custom_id, r.code) for r in result.rejections] == [("bad", "invalid_method")]
    entries = entries_of(result.prefixes.order(rejected=(r.line for r in result.rejections)), base=len(BOM))
    assert len(entries) == len(records)
    stored_lines = content.removeprefix(BOM).split(b"\n")
    for entry in entries:
        read = content[entry.offset:entry.offset + entry.length]
        assert read == stored_lines[entry.line - 1]  # the record's whole line, a CR left on it as read
        assert orjson.loads(read)["custom_id"] == orjson.loads(stored_lines[entry.line - 1])["custom_id"]


def test_inline_offsets_match_the_stored_requests(tmp_path):
    records = shuffled_records(model="m/chat")
    # As the create body holds them: one of them spread over lines (the store turns its newlines into spaces).
    raws = [orjson.dumps(r, option=orjson.OPT_INDENT_2) if i == 2 else orjson.dumps(r) for i, r in enumerate(records)]
    result = scan_records(lambda: inline_lines(raws), endpoint=CHAT, catalog=CATALOG, max_records=1000,
                          collect_prefixes=True)
    stored = b"".join(raw.replace(b"\n", b" ") + b"\n" for raw in raws)  # service.batches._store_inline's layout
    for entry in entries_of(result.prefixes.order()):
        assert stored[entry.offset:entry.offset + entry.length] == raws[entry.line - 1].replace(b"\n", b" ")


def test_prompt_fields_of_completions_and_responses(tmp_path):
    prompt = SYSTEMS["mid"]
    completions = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "m/chat", "prompt": prompt + f" Q{i}"}} for i in range(3)]
    result = scanned(jsonl(*completions), tmp_path, endpoint="/v1/completions")
    assert {e.shared_bytes for e in entries_of(result.prefixes.order())} == {max(L for L in LEVELS if L < len(prompt))}
    responses = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
                  "body": {"model": "m/chat", "input": f"Q{i}", "instructions": prompt}} for i in range(3)]
    result = scanned(jsonl(*responses), tmp_path, endpoint="/v1/responses")
    assert all(e.group != 0 for e in entries_of(result.prefixes.order()))  # instructions come before input


def test_the_blob_format_round_trips_and_streams():
    entries = [DispatchEntry(line=7, offset=2 ** 40, length=123, group=2 ** 64 - 1, shared_bytes=65536),
               DispatchEntry(line=1, offset=0, length=1, group=0, shared_bytes=0)] * 3000
    blob = b"".join(ENTRY.pack(*entry) for entry in entries)
    assert ENTRY.format == "<IQIQI" and ENTRY.size == 28 and len(blob) == 28 * len(entries)
    assert blob[:28] == ENTRY.pack(7, 2 ** 40, 123, 2 ** 64 - 1, 65536)

    class Trickle(io.BytesIO):
        def read(self, size: int = -1) -> bytes:  # an object store's stream hands back less than asked
            return super().read(min(size, 1000) if size > 0 else size)

    assert list(read_entries(Trickle(blob))) == entries
    with pytest.raises(ValueError, match="inside an entry"):
        list(read_entries(io.BytesIO(blob[:-3])))


def test_collecting_keeps_no_bodies_and_stays_small(tmp_path):
    records = [chat_record(f"r{i}", SYSTEMS["big"], f"Question {i}?", "m/chat") for i in range(400)]
    collector = scanned(jsonl(*records), tmp_path).prefixes
    assert isinstance(collector, PrefixCollector) and len(collector) == 400
    assert collector.nbytes() < 400 * 100  # a few numbers a record, where each record is over 4 KB


def test_numbers_out_of_range_are_still_refused_and_big_integers_pass(tmp_path):
    base = chat_record("x", SYSTEMS["mid"], "q", "m/chat")
    lines = [
        orjson.dumps(base).replace(b'"max_tokens":8', b'"max_tokens":1e400'),
        orjson.dumps(base).replace(b'"content":"q"', b'"content":"q","n":[1e400]'),  # inside the prompt itself
        orjson.dumps(base).replace(b'"max_tokens":8', b'"seed":' + b"9" * 400),
        orjson.dumps(chat_record("ok", SYSTEMS["mid"], "the figure 1e400 in a string", "m/chat")),
        orjson.dumps(base).replace(b'"max_tokens":8', b'"top_p":1' + b"0" * 300 + b"e9"),  # 310 digits in all
    ]
    lines = [line.replace(b'"custom_id":"x"', f'"custom_id":"x{i}"'.encode()) for i, line in enumerate(lines)]
    result = scanned(jsonl(*lines), tmp_path)
    assert [(r.line, r.code) for r in result.rejections] == [(1, "invalid_json"), (2, "invalid_json"),
                                                             (5, "invalid_json")]
    assert result.rejections[0].message == RANGE and result.rejections[1].message == RANGE
    assert sorted(e.line for e in entries_of(result.prefixes.order(r.line for r in result.rejections))) == [3, 4]


# -- the create, over HTTP ----------------------------------------------------------------------------------------


def dispatch_blob(server: Server, batch_id: str) -> Path:
    return server.data_dir / "blobs" / "batches" / batch_id / "dispatch.bin"


def stored_input(server: Server, file_id: str) -> bytes:
    answer = server.http("GET", f"/files/{file_id}/content")
    assert answer.status_code == 200, answer.text
    return answer.content


@pytest.fixture
def api_server(make_server):
    return make_server(args=("--no-worker",))  # nothing runs the batches: the blob is read as the create left it


@pytest.mark.parametrize("how", ["file", "inline"])
def test_a_chat_batch_stores_its_dispatch_order(api_server, how):
    records = shuffled_records()
    content = BOM + jsonl(*records) if how == "file" else None
    fields: dict[str, Any] = {"input_file_id": upload(api_server, content)} if content else {"requests": records}
    answer = post_batch(api_server, **fields)
    assert answer.status_code == 200, answer.text
    batch = answer.json()
    with open(dispatch_blob(api_server, batch["id"]), "rb") as handle:
        entries = list(read_entries(handle))
    stored = stored_input(api_server, batch["input_file_id"])
    assert stored.startswith(BOM) == (how == "file")
    read = [orjson.loads(stored[e.offset:e.offset + e.length]) for e in entries]
    assert sorted(e.line for e in entries) == list(range(1, len(records) + 1))
    assert [r["custom_id"] for r in read] == [records[e.line - 1]["custom_id"] for e in entries]
    assert runs([group_of(r["custom_id"]) for r in read]) == [("mid", 9), ("big", 5), ("small", 3), ("alone", 4)]


def test_no_order_is_stored_without_grouping_or_for_embeddings(make_server, engine_url):
    catalog = catalog_text(engine_url, slots=1, concurrency=1, echo="prefix_grouping = false")
    server = make_server(catalog=catalog, args=("--no-worker",))
    answer = post_batch(server, requests=shuffled_records())
    assert answer.status_code == 200, answer.text
    assert not dispatch_blob(server, answer.json()["id"]).exists()
    long_text = SYSTEMS["big"]
    answer = post_batch(server, endpoint=EMBEDDINGS,
                        requests=[embed(f"e{i}", long_text, "test/embed") for i in range(4)])
    assert answer.status_code == 200, answer.text
    assert not dispatch_blob(server, answer.json()["id"]).exists()


def test_short_prompts_store_no_order_and_a_dry_run_estimates_the_reuse(api_server):
    short = [chat_record(f"s{i}", "Be brief.", f"q{i}") for i in range(5)]
    answer = post_batch(api_server, requests=short)
    assert answer.status_code == 200, answer.text
    assert not dispatch_blob(api_server, answer.json()["id"]).exists()  # nothing to share: input order

    dry = post_batch(api_server, requests=shuffled_records(), dry_run=True)
    assert dry.status_code == 200, dry.text
    estimate = dry.json()["openrelay"]["estimate"]
    records = shuffled_records()
    real = scan_records(lambda: inline_lines([orjson.dumps(r) for r in records]), endpoint=CHAT,
                        catalog=parse_catalog(TEST_CATALOG.format(engine="http://127.0.0.1:9/v1", slots=1,
                                                                  concurrency=1)),
                        max_records=1000, collect_prefixes=True)
    assert estimate["reusable_prefix_tokens"] == real.prefixes.order().reusable_bytes() // 4 > 0
    assert estimate["reusable_prefix_counted"] == "approximate"
