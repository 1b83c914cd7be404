"""What a run bills its records. A batch that holds a hard budget's reservation (``store/budgets.py``) starts a
record only when the record's worst case (``engines/worst_case.py``) fits in what the batch still holds, less the
worst cases of its records in flight, and bills it at most that worst case, whatever its engine reports. Any batch
counts an engine's over-report (usage past the worst case) in the log and on ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..catalog import ModelSpec, TokenPrice
from ..engines.worst_case import COUNTED_IN_PROCESS, WorstCase, worst_case
from ..metrics import OVER_REPORTS
from ..types import Batch
from .usage import RecordUsage, record_usage

__all__ = ["Billing", "Hold", "NoRoom"]

log = logging.getLogger("openrelay.worker")


class NoRoom(Exception):
    """A record whose worst case does not fit in what its batch's reservation has left: its error line's."""

    code = "key_budget_exceeded"


@dataclass(slots=True)
class Hold:
    """A running record's share of the batch's reservation: its worst case's cost."""

    line: int
    worst: WorstCase
    cost: int
    billed: bool = False


class Billing:
    def __init__(self, batch: Batch, spec: ModelSpec, price: TokenPrice) -> None:
        self.batch, self.spec, self.price = batch, spec, price
        # What the batch holds that no record has taken: its reservation as claimed (one lease holder runs a batch,
        # so nothing else bills from it meanwhile). None: it holds none, and nothing is held back.
        self.room: int | None = batch.reserved_nano_usd or None
        self._logged = False

    @contextlib.asynccontextmanager
    async def holding(self, line: int, body: dict[str, Any]) -> AsyncIterator[Hold]:
        """The record's hold while it runs; ``NoRoom`` when its worst case does not fit. A record that ends
        unbilled (an error line, or stopped) gives its hold back whole."""
        if self.spec.engine.get("kind") in COUNTED_IN_PROCESS:  # a tokenizer or a model counts: not on the loop
            worst = await asyncio.to_thread(worst_case, self.spec, self.batch.endpoint, body)
        else:
            worst = worst_case(self.spec, self.batch.endpoint, body)
        hold = Hold(line, worst, self.price.cost(worst.input_tokens, worst.output_tokens))
        if self.room is not None:
            if hold.cost > self.room:
                raise NoRoom(f"this request may cost up to {hold.cost} nano-USD and what its batch holds of the "
                             f"key's hard budget has {self.room} nano-USD left for it")
            self.room -= hold.cost
        try:
            yield hold
        finally:
            if self.room is not None and not hold.billed:
                self.room += hold.cost

    def bill(self, hold: Hold, answer: dict[str, Any]) -> tuple[RecordUsage, int]:
        """The usage and cost of the record's answer; what the hold had beyond that cost goes back."""
        hold.billed = True
        usage = record_usage(self.batch.endpoint, answer)
        worst = hold.worst
        over = [name for name, reported, most in (("prompt", usage.input_tokens, worst.input_tokens),
                                                  ("completion", usage.output_tokens, worst.output_tokens))
                if reported > most and not (name == "prompt" and worst.calls > 1)]  # tool results grow prompts
        for name in over:
            OVER_REPORTS.labels(self.spec.name, name).inc()
        if over:  # a warning for the run's first: an engine that ignores max_tokens does so for every record
            (log.debug if self._logged else log.warning)(
                "batch %s line %d: the engine reported %d prompt and %d completion tokens, past the record's worst "
                "case of %d and %d%s", self.batch.id, hold.line, usage.input_tokens, usage.output_tokens,
                worst.input_tokens, worst.output_tokens, "; billed the worst case" if self.room is not None else "")
            self._logged = True
        if self.room is None:
            return usage, self.price.cost(usage.input_tokens, usage.output_tokens, usage.cached_tokens)
        input_tokens = min(usage.input_tokens, worst.input_tokens)
        output_tokens = min(usage.output_tokens, worst.output_tokens)
        usage = dataclasses.replace(usage, input_tokens=input_tokens, output_tokens=output_tokens,
                                    cached_tokens=min(usage.cached_tokens, input_tokens),
                                    reasoning_tokens=min(usage.reasoning_tokens, output_tokens))
        cost = min(hold.cost, self.price.cost(input_tokens, output_tokens, usage.cached_tokens))
        self.room += hold.cost - cost
        return usage, cost
