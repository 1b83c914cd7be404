"""The one shape of every retry policy's wait: a base after the first failure, doubling after each further one,
never over a cap, and optionally spread by a random factor so that failures that happened together are not
retried together. Each policy keeps its own numbers (``config.Settings``); only the arithmetic lives here."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff", "NO_JITTER"]

NO_JITTER = (1.0, 1.0)
_MOST_DOUBLINGS = 64  # past this the cap has long been reached; keeps a long outage's count from overflowing a float


@dataclass(frozen=True, kw_only=True)
class Backoff:
    base: float  # the wait after the first failure
    cap: float  # no wait is longer, jitter included
    jitter: tuple[float, float] = NO_JITTER  # the wait is multiplied by a factor drawn uniformly from this range

    def nominal(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1 for the first), before jitter."""
        return min(self.cap, self.base * 2.0 ** min(max(failures - 1, 0), _MOST_DOUBLINGS))

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after ``failures`` failures in a row, jittered; ``rng`` for a reproducible draw."""
        low, high = self.jitter
        factor = low if low == high else (rng or random).uniform(low, high)
        return min(self.cap, self.nominal(failures) * factor)
