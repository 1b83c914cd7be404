"""What the test engine can simulate of a real inference engine, all of it off by default: a prefix cache of prompt
blocks (an LRU keyed by the hash of the whole prefix, as vLLM's), a service time that a cached prefix shortens, a
capacity knee past which every request slows down, a limit past which the engine answers 429, and a scheduler: a
number of slots, a waiting queue in arrival or priority order, and preemption (``Scheduler``).

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
from dataclasses import dataclass, field
from typing import Any

__all__ = ["METRICS_DIALECTS", "Job", "PrefixCache", "Scheduler", "Simulation"]

# How /metrics names the scheduler's counts, as the real engines do, then broken answers for tests: text that is not
# Prometheus, Prometheus without the names, an HTTP 500.
METRICS_DIALECTS = ("vllm", "sglang", "llama.cpp", "garbage", "missing", "500")


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """The engine's simulated capacity; every default leaves the engine as it always was."""

    cache_blocks: int = 0  # prefix cache capacity in blocks; 0: no cache, answers carry no cached_tokens
    block_tokens: int = 64  # tokens (the prompt's words) per cache block
    prefill_seconds_per_token: float = 0.0  # service time per prompt token not served from the cache
    decode_seconds: float = 0.0  # service time of every request on top of its prefill
    knee: int = 0  # past this many requests running each one's time grows by (in_flight / knee) ** 2; 0: none
    max_in_flight: int = 0  # a request arriving when this many are in flight is answered 429; 0: no limit
    slots: int = 0  # at most this many requests are served at once, the rest wait; 0: no limit
    scheduling: str = field(default="fcfs", metadata={"choices": ("fcfs", "priority")})  # the waiting queue's order
    preempt: bool = False  # with priority scheduling, a newcomer with a lower value may take a running one's slot
    metrics_dialect: str = field(default="vllm", metadata={"choices": METRICS_DIALECTS})  # how /metrics answers

    def changed(self, changes: dict[str, Any]) -> Simulation:
        """This simulation with ``changes`` (field names to values); ValueError for an unknown name or a bad value."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(types))
        if unknown:
            raise ValueError(f"unknown settings {unknown}; known: {sorted(types)}")
        values: dict[str, Any] = {}
        choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(self)}
        for name, value in changes.items():
            if types[name] == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"{name} must be true or false, not {value!r}")
                values[name] = value
                continue
            if types[name] == "str":
                if value not in choices[name]:
                    raise ValueError(f"{name} must be one of {list(choices[name])}, not {value!r}")
                values[name] = value
                continue
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
            if f.type == "bool":
                parser.add_argument("--" + f.name.replace("_", "-"), action="store_true", dest=f.name,
                                    help=f"simulation: {f.name}")
                continue
            if f.type == "str":
                parser.add_argument("--" + f.name.replace("_", "-"), choices=f.metadata["choices"], default=f.default,
                                    dest=f.name, help=f"simulation: {f.name} (default {f.default})")
                continue
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


@dataclass(eq=False, kw_only=True)
class Job:
    """One request in the scheduler: its ``priority`` value (lower first), its place in arrival order and whether it
    holds a slot now."""

    priority: int = 0
    arrival: int = 0
    running: bool = False


class Scheduler:
    """Which requests run and which wait. At most ``slots`` run at once (0: no limit); the rest wait in arrival order
    (``fcfs``), or by priority value, lower first and in arrival order within a value (``priority``, as vLLM's
    ``--scheduling-policy priority``). With ``preempt`` too, a newcomer that finds no free slot takes the slot of the
    running request with the highest value if that value is higher than its own (the latest to arrive among equals);
    that request waits again, in its old place, and starts over when it runs again (vLLM's recompute preemption).

    ``arrive`` and ``leave`` return the jobs whose ``running`` they changed, for the caller to start or stop them."""

    def __init__(self, simulation: Simulation) -> None:
        self.simulation = simulation
        self.running: list[Job] = []
        self.waiting: list[Job] = []
        self.arrivals = 0
        self.preemptions = 0
        self.max_waiting = 0

    def order(self, job: Job) -> tuple[int, int]:
        return (job.priority if self.simulation.scheduling == "priority" else 0, job.arrival)

    def arrive(self, job: Job) -> list[Job]:
        job.arrival, self.arrivals = self.arrivals, self.arrivals + 1
        if self.has_free_slot():
            return self.start(job)
        if self.simulation.preempt and self.simulation.scheduling == "priority" and self.running:
            victim = max(self.running, key=self.order)
            if victim.priority > job.priority:
                self.preemptions += 1
                self.running.remove(victim)
                victim.running = False
                self.queue(victim)
                return [victim, *self.start(job)]
        self.queue(job)
        return []

    def leave(self, job: Job) -> list[Job]:
        """``job`` answered or its client went away, running or waiting; returns the jobs that start in its place."""
        if job.running:
            self.running.remove(job)
            job.running = False
        elif job in self.waiting:
            self.waiting.remove(job)
        return self.admit()

    def configure(self, simulation: Simulation) -> list[Job]:
        """New settings (more slots, another order) for the jobs here now and later; returns the jobs that start."""
        self.simulation = simulation
        return self.admit()

    def admit(self) -> list[Job]:
        started: list[Job] = []
        self.waiting.sort(key=self.order)
        while self.waiting and self.has_free_slot():
            started += self.start(self.waiting.pop(0))
        return started

    def has_free_slot(self) -> bool:
        return not self.simulation.slots or len(self.running) < self.simulation.slots

    def start(self, job: Job) -> list[Job]:
        job.running = True
        self.running.append(job)
        return [job]

    def queue(self, job: Job) -> None:
        self.waiting.append(job)
        self.waiting.sort(key=self.order)
        self.max_waiting = max(self.max_waiting, len(self.waiting))
