"""What the test engine can simulate of a real inference engine, all of it off by default: a prefix cache of prompt
blocks (an LRU keyed by the hash of the whole prefix, as vLLM's), a service time that a cached prefix shortens, a
capacity knee past which every request slows down, and a limit past which the engine answers 429.

Pure bookkeeping with no HTTP and no clock: tests/support/test_engine.py serves it, takes its settings from its
command line or ``POST /control/config``, and sleeps the seconds it computes. Tests check its counts (cached tokens,
429s, simulated seconds), never how long anything took.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PrefixCache", "Simulation"]


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """The engine's simulated capacity; every default leaves the engine as it always was."""

    cache_blocks: int = 0  # prefix cache capacity in blocks; 0: no cache, answers carry no cached_tokens
    block_tokens: int = 64  # tokens (the prompt's words) per cache block
    prefill_seconds_per_token: float = 0.0  # service time per prompt token not served from the cache
    decode_seconds: float = 0.0  # service time of every request on top of its prefill
    knee: int = 0  # past this many requests in flight each one's time grows by (in_flight / knee) ** 2; 0: none
    max_in_flight: int = 0  # a request arriving when this many are in flight is answered 429; 0: no limit

    def changed(self, changes: dict[str, Any]) -> Simulation:
        """This simulation with ``changes`` (field names to values); ValueError for an unknown name or a bad value."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(types))
        if unknown:
            raise ValueError(f"unknown settings {unknown}; known: {sorted(types)}")
        values: dict[str, Any] = {}
        for name, value in changes.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, not {value!r}")
            if types[name] == "int" and value != int(value):
                raise ValueError(f"{name} must be a whole number, not {value!r}")
            values[name] = int(value) if types[name] == "int" else float(value)
        if values.get("block_tokens", self.block_tokens) < 1:
            raise ValueError("block_tokens must be at least 1")
        return dataclasses.replace(self, **values)

    def slowdown(self, in_flight: int) -> float:
        """How many times longer a request takes that starts with ``in_flight`` requests (itself included) in the
        engine. Up to the knee the engine's throughput grows with the requests it runs at once; past it each one's
        time grows faster than their number, so throughput falls (as knee ** 2 / in_flight)."""
        return (in_flight / self.knee) ** 2 if self.knee and in_flight > self.knee else 1.0

    def prefill_seconds(self, uncached_tokens: int, in_flight: int) -> float:
        """Time to compute the prompt's ``uncached_tokens`` (those not found in the cache)."""
        return self.prefill_seconds_per_token * uncached_tokens * self.slowdown(in_flight)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """One ``--cache-blocks``-style option per setting, defaulting to the field's default."""
        for f in dataclasses.fields(Simulation):
            parser.add_argument("--" + f.name.replace("_", "-"), type=int if f.type == "int" else float,
                                default=f.default, dest=f.name, help=f"simulation: {f.name} (default {f.default})")

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> Simulation:
        return cls().changed({f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


class PrefixCache:
    """An LRU of prompt blocks. A block is ``block_tokens`` tokens of the prompt, identified by the hash of the whole
    prompt up to its end, so a block is found only after the very same prefix. Only whole blocks are kept, and, as
    in vLLM, a prompt found in full still computes its last token: the hits stop one token short of its end.
    A request looks its blocks up when it arrives and puts them in once its prefill is done, so requests that arrive
    together with the same new prefix all compute it, as in a real engine."""

    def __init__(self, capacity_blocks: int, block_tokens: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.blocks: OrderedDict[bytes, None] = OrderedDict()  # the least recently used first

    def look_up(self, tokens: Sequence[str]) -> tuple[int, list[bytes]]:
        """(the tokens of the prompt's leading blocks found in the cache, the keys of all its whole blocks)."""
        if self.capacity_blocks <= 0:
            return 0, []
        keys: list[bytes] = []
        digest = b""
        size = self.block_tokens
        for end in range(size, len(tokens) + 1, size):
            digest = hashlib.blake2b(digest + "\x1f".join(tokens[end - size : end]).encode(), digest_size=16).digest()
            keys.append(digest)
        hits = 0
        for i, key in enumerate(keys):
            if (i + 1) * size > len(tokens) - 1 or key not in self.blocks:
                break
            hits += 1
        return hits * size, keys

    def put(self, keys: list[bytes]) -> None:
        """Puts in or touches a prompt's blocks, its first blocks last so that they are evicted last (a shared
        system prompt outlives the documents after it)."""
        for key in reversed(keys):
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)
