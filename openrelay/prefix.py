"""Shared prompt prefixes of a batch's records, and the order its records are dispatched in (issue 20).

Records whose prompts begin alike are sent back to back, the largest group first, so an engine's prefix (KV)
cache meets each shared prefix many times in a row. A record's prompt material is the raw JSON bytes of the
body fields an engine renders first (``PROMPT_FIELDS``), never decoded; it is hashed at each of ``LEVELS``
prefix lengths, each level's hash built on the one before (``chain_hashes``), so equal hashes at a level mean an
equal prefix of that many bytes (but for the odds of a CRC collision, which cost only a less useful order).

The create writes the order as a blob of ``ENTRY`` records (``DispatchOrder.encoded``), which a worker streams
back (``read_entries``) to read each record from the stored input by its offset and length.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, BinaryIO, NamedTuple

import msgspec
import numpy as np
from numpy.typing import ArrayLike

__all__ = ["PROMPT_FIELDS", "LEVELS", "ENTRY", "DispatchEntry", "PrefixCollector", "DispatchOrder", "prompt_reader",
           "chain_hashes", "read_entries"]

# The body fields whose raw bytes make a record's prompt, in the order an engine sees them (the system or
# developer messages lead ``messages``; ``instructions`` come before ``input``). Embeddings are not grouped.
PROMPT_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("messages",),
    "/v1/completions": ("prompt",),
    "/v1/responses": ("instructions", "input"),
    "/v1/messages": ("system", "messages"),
}
LEVELS = tuple(256 << i for i in range(9))  # the prefix lengths hashed: 256 B, 512 B, ... 64 KiB
ENTRY = struct.Struct("<IQIQI")  # line (1-based), offset, length (no newline), group, shared_bytes
_BLOCK = 4096  # entries read at a time
_ENTRY_DTYPE = np.dtype([("line", "<u4"), ("offset", "<u8"), ("length", "<u4"), ("group", "<u8"),
                         ("shared_bytes", "<u4")])  # ENTRY's layout, packed
_SHARED_BYTES = np.array((0, *LEVELS), np.uint32)  # by the number of levels a record shares
_EDGES = np.array((0, LEVELS[0] // 2, *LEVELS), np.int64)  # a prompt's blocks: the first 128 bytes, then a level's
_view: Callable[[bytes | memoryview], memoryview] = memoryview  # typed for map(): a prompt's bytes, uncopied


class DispatchEntry(NamedTuple):
    line: int  # the record's 1-based line in the input
    offset: int  # byte offset of its line in the stored input blob
    length: int  # byte length of the line, without its newline
    group: int  # hash of the deepest prefix it shares with another record of the batch; 0: none
    shared_bytes: int  # the length of that prefix; 0: none


def chain_hashes(depths: ArrayLike, crcs: ArrayLike) -> np.ndarray:
    """Each level's hash of records with ``depths[i]`` levels, from their blocks' CRCs (``PrefixCollector``).

    A prefix is its blocks: the first 128 bytes, the next 128 (level 0 ends at 256), then each level's new
    bytes. Each block's CRC-32 (zlib's, stable across processes, unlike ``hash()``), tagged with its place, is
    mixed to 64 bits (a bijection) and the hash of a level is the sum of its blocks' mixes, modulo 2**64: equal
    prefixes hash alike; prefixes that differ in their last block alone collide only if its CRCs do (odds of
    2**-32), others with odds near 2**-64. Never 0, which means no group."""
    depths = np.asarray(depths, np.int64)
    blocks = np.asarray(crcs, np.uint64)
    if not blocks.size:
        return np.zeros(0, np.uint64)
    counts = depths + 1
    starts = np.cumsum(counts) - counts
    place = np.arange(blocks.size) - np.repeat(starts, counts)
    sums = np.cumsum(_mix(blocks | (place.astype(np.uint64) << np.uint64(32))))
    before = np.where(starts > 0, sums[np.maximum(starts - 1, 0)], np.uint64(0))  # the sum before each record
    level = np.arange(int(depths.sum())) - np.repeat(np.cumsum(depths) - depths, depths)
    ends = np.repeat(starts, depths) + level + 1  # a level's last block: level 0 ends with the second
    hashes = sums[ends] - np.repeat(before, depths)
    hashes[hashes == 0] = 1
    return hashes


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, on a copy: a bijection of 64-bit values that spreads every bit."""
    values = values ^ (values >> np.uint64(30))
    values *= np.uint64(0xBF58476D1CE4E5B9)
    values ^= values >> np.uint64(27)
    values *= np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def prompt_reader(fields: tuple[str, ...]) -> Callable[[Any], Any] | None:
    """How the create takes a record's prompt material from its decoded body (``validation.records.Body``): the
    one field's ``msgspec.Raw``, or the present fields' bytes joined; ``msgspec.UNSET`` for none. None for an
    endpoint without prompt fields."""
    if not fields:
        return None
    if len(fields) == 1:
        return attrgetter(fields[0])

    def joined(body: Any) -> Any:
        parts = [bytes(part) for part in (getattr(body, name) for name in fields) if part is not msgspec.UNSET]
        return b"".join(parts) if parts else msgspec.UNSET

    return joined


class PrefixCollector:
    """What the order needs of each record, gathered during the create's scan in compact arrays (never a body):
    its line, the offset of its line in the input (counted from the first line: ``DispatchOrder.encoded`` adds
    what precedes it), the line's length, and its prefix chain. Records with prompts shorter than a level have
    none, so chains are kept for the records that have one only: ``chained``, with their ``depths`` and the CRCs
    of their prompts' blocks (``crcs``), hashed only when the order is made (``chain_hashes``)."""

    __slots__ = ("_columns", "_count", "_consumed", "chained", "depths", "crcs")

    def __init__(self) -> None:
        self._columns: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (lines, offsets, lengths) per block
        self._count = 0
        self._consumed = 0  # bytes of the lines of every block added, newlines left out
        self.chained = array("I")  # indices of the records with a chain, ascending
        self.depths = array("B")
        self.crcs = array("I")  # the CRC-32 of each block of each chained record's prompt (``chain_hashes``)

    def add_block(self, first_line: int, lengths: np.ndarray, left_out: Sequence[int] = ()) -> None:
        """Add the records of the next block of lines (every line of the input comes in one block, in order), of
        ``lengths`` bytes each: each of its lines but those ``left_out`` (their indices: blank lines, rejected
        records)."""
        ends = np.cumsum(lengths)
        offsets = ends - lengths + (self._consumed + first_line - 1) + np.arange(len(lengths))  # a newline a line
        lines = np.arange(first_line, first_line + len(lengths), dtype=np.int64)
        self._consumed += int(ends[-1]) if len(lengths) else 0
        if left_out:
            kept = np.ones(len(lengths), np.bool_)
            kept[list(left_out)] = False
            lines, offsets, lengths = lines[kept], offsets[kept], lengths[kept]
        self._columns.append((lines, offsets, lengths))
        self._count += len(lines)

    def add_chains(self, indices: Sequence[int], materials: Sequence[bytes | memoryview]) -> None:
        """Give records ``indices`` (added by ``add_block``, or about to be) the chains of their prompt materials,
        each at least ``LEVELS[0]`` bytes long: the CRC-32 of each block of it (``chain_hashes``). A block of
        records at a time, so that the per-record work is C's (maps), not Python's."""
        if not indices:
            return
        sizes = np.array(list(map(len, materials)), np.int64)
        depths = np.minimum(np.searchsorted(_EDGES, sizes, side="right") - 2, len(LEVELS))  # the levels each has
        blocks = depths + 1
        place = np.arange(int(blocks.sum())) - np.repeat(np.cumsum(blocks) - blocks, blocks)
        views: Iterator[memoryview] = chain.from_iterable(map(repeat, map(_view, materials), blocks.tolist()))
        spans = map(slice, _EDGES[place].tolist(), _EDGES[place + 1].tolist())
        self.crcs.extend(map(zlib.crc32, map(memoryview.__getitem__, views, spans)))
        self.chained.extend(indices)
        self.depths.extend(depths.tolist())

    def __len__(self) -> int:
        return self._count

    def nbytes(self) -> int:
        """The bytes its columns hold."""
        held = sum(column.nbytes for block in self._columns for column in block)
        return held + sum(len(a) * a.itemsize for a in (self.chained, self.depths, self.crcs))

    def may_share(self) -> bool:
        """Whether two records at least are long enough to share a prefix (else the order is the input's)."""
        return len(self.chained) >= 2

    def order(self, rejected: Iterable[int] = ()) -> DispatchOrder:
        """The dispatch order of the records collected, less those on a ``rejected`` line."""
        lines, offsets, lengths = (np.concatenate(column) for column in zip(*self._columns, strict=True)) \
            if self._columns else (np.zeros(0, np.int64),) * 3
        depths = np.zeros(self._count, np.intp)
        depths[np.asarray(self.chained, np.intp)] = np.asarray(self.depths, np.intp)
        crcs = np.asarray(self.crcs, np.uint64)
        kept = ~np.isin(lines, np.fromiter(rejected, np.int64))
        if not kept.all():
            crcs = crcs[np.repeat(kept, depths + (depths > 0))]
            lines, offsets, lengths, depths = lines[kept], offsets[kept], lengths[kept], depths[kept]
        return DispatchOrder(lines, offsets, lengths, depths, chain_hashes(depths[depths > 0], crcs))


class DispatchOrder:
    """Records in trie order over their chains. Records that share a prefix are adjacent; at each level the
    groups by descending size (ties: the first seen first); inside a group, its deeper groups first, then its
    records that share nothing deeper, in input order; records that share nothing come last, in input order.

    The inputs are the collector's columns, one item per record (``depths[i]`` hashes of ``hashes`` each). The
    work is done on whole columns (numpy), and per group, never per record in Python."""

    def __init__(self, lines: ArrayLike, offsets: ArrayLike, lengths: ArrayLike, depths: ArrayLike,
                 hashes: ArrayLike) -> None:
        self._lines = np.asarray(lines, np.uint32)
        n = len(self._lines)
        self._offsets = np.asarray(offsets, np.uint64)
        self._lengths = np.asarray(lengths, np.uint32)
        self.groups: list[tuple[int, int, int]] = []  # (hash, level, records sharing it) of every group
        self.shared = np.zeros(n, np.intp)  # how many levels of its chain each record shares with another
        self._group_of = np.zeros(n, np.uint64)  # the hash of each record's deepest shared prefix, or 0
        chain_hashes = np.asarray(hashes, np.uint64)
        if chain_hashes.size:
            self._positions = self._trie_order(np.asarray(depths, np.intp), chain_hashes)
        else:
            self._positions = np.arange(n)

    def _trie_order(self, depths: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """The records' indices in dispatch order; fills ``groups``, ``shared`` and ``_group_of``."""
        keys, key_of, counts = np.unique(hashes, return_inverse=True, return_counts=True)
        bounds = np.zeros(len(depths) + 1, np.intp)
        np.cumsum(depths, out=bounds[1:])
        # A prefix shared at a level is shared at every level above it, so a record shares the first
        # ``shared[i]`` levels of its chain: the count of its hashes seen more than once.
        seen_twice = counts[key_of] >= 2
        twice = np.zeros(len(hashes) + 1, np.intp)
        np.cumsum(seen_twice, out=twice[1:])
        self.shared = shared = twice[bounds[1:]] - twice[bounds[:-1]]
        sharing = np.flatnonzero(shared)
        deepest = bounds[sharing] + shared[sharing] - 1  # where in ``hashes`` each sharing record's group is
        self._group_of[sharing] = hashes[deepest]
        # Every group: a key seen twice, with its level, its parent (the key one level up) and where first seen.
        places = np.flatnonzero(seen_twice)
        group_keys, firsts = np.unique(key_of[places], return_index=True)
        firsts = places[firsts]
        levels = firsts - bounds[np.searchsorted(bounds, firsts, side="right") - 1]
        parents = np.where(levels > 0, key_of[np.maximum(firsts - 1, 0)], -1)
        order = np.argsort(firsts, kind="stable")  # groups in the order first seen
        group_keys, firsts, levels, parents = group_keys[order], firsts[order], levels[order], parents[order]
        index_of = {int(key): index for index, key in enumerate(group_keys.tolist())}
        sizes = counts[group_keys].tolist()
        self.groups = list(zip(keys[group_keys].tolist(), levels.tolist(), sizes, strict=True))
        children: list[list[int]] = [[] for _ in sizes]
        roots: list[int] = []
        for node, parent in enumerate(parents.tolist()):
            (children[index_of[parent]] if parent >= 0 else roots).append(node)
        # Ranks in post-order: a group's deeper groups (largest first) come before the records it holds itself.
        rank = np.zeros(len(sizes) + 1, np.intp)
        rank[-1] = len(sizes)  # records that share nothing
        next_rank = 0
        stack = [(node, False) for node in reversed(_by_size(roots, sizes))]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                rank[node] = next_rank
                next_rank += 1
            else:
                stack.append((node, True))
                stack.extend((child, False) for child in reversed(_by_size(children[node], sizes)))
        node_of = np.full(len(shared), len(sizes), np.intp)
        lookup = np.zeros(len(keys), np.intp)
        lookup[group_keys] = np.arange(len(group_keys))
        node_of[sharing] = lookup[key_of[deepest]]
        return np.argsort(rank[node_of], kind="stable")

    def __len__(self) -> int:
        return len(self._positions)

    def reusable_bytes(self) -> int:
        """Prompt bytes a prefix cache could serve, were it to keep each group while the group runs: all but the
        first record dispatched of a group find the bytes its level adds to the group above it."""
        return sum((size - 1) * (LEVELS[level] - (LEVELS[level - 1] if level else 0))
                   for _, level, size in self.groups)

    def encoded(self, base: int = 0) -> bytes:
        """The blob's bytes: ``ENTRY`` after ``ENTRY``, nothing else. ``base`` is added to every offset (the
        collector's count from the first line: a byte order mark before it is not part of any line)."""
        positions = self._positions
        table = np.empty(len(positions), _ENTRY_DTYPE)
        table["line"] = self._lines[positions]
        table["offset"] = self._offsets[positions] + np.uint64(base)
        table["length"] = self._lengths[positions]
        table["group"] = self._group_of[positions]
        table["shared_bytes"] = _SHARED_BYTES[self.shared[positions]]
        return table.tobytes()


def _by_size(nodes: Sequence[int], sizes: list[int]) -> list[int]:
    return sorted(nodes, key=lambda node: (-sizes[node], node))


def read_entries(handle: BinaryIO) -> Iterator[DispatchEntry]:
    """The entries of a dispatch-order blob, streamed; ``ValueError`` if it ends inside an entry."""
    size = ENTRY.size
    pending = b""
    while chunk := handle.read(size * _BLOCK):
        data = pending + chunk if pending else chunk
        whole = len(data) - len(data) % size
        yield from map(DispatchEntry._make, ENTRY.iter_unpack(memoryview(data)[:whole]))
        pending = data[whole:]
    if pending:
        raise ValueError(f"dispatch order ends inside an entry ({len(pending)} of {ENTRY.size} bytes)")
