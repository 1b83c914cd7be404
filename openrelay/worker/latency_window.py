"""What the adaptive limiter (``limiter.py``) measures: windows of calls sent one after another under one limit,
judged on a typical call's latency (the ``QUANTILE`` of its answers) with a one-sided binomial test
(``significant``)."""

from __future__ import annotations

import functools
import math

__all__ = ["QUANTILE", "SIGNIFICANCE", "Window", "significant"]

# The window's typical call: slower than 60% of its answers. Above the median, so that a slowdown of the calls sent
# while most slots are taken shows (in a burst, the first calls sent still found the engine unloaded); below the
# upper quartile, which calls of varying length (unreported) reach on their noise alone.
QUANTILE = 0.6
# A window is judged slower only when so many of its answers are slower that a window whose typical call is within
# the tolerance would have as many with at most this probability (a binomial test), and the upper bound of its
# typical latency at the same level is what it offers the baseline.
SIGNIFICANCE = 0.05


@functools.cache
def significant(n: int, share: float) -> int:
    """The fewest of ``n`` answers that, if each had probability ``share`` of being counted, would be counted with
    a probability of at most ``SIGNIFICANCE`` (a one-sided binomial test); ``n`` itself when even all ``n`` would
    not be that unlikely."""
    tail = 0.0
    for k in range(n, -1, -1):  # in logarithms: the binomial coefficients of a few hundred calls overflow a float
        tail += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                         + k * math.log(share) + (n - k) * math.log(1 - share))
        if tail > SIGNIFICANCE:
            return min(n, k + 1)
    return n


class Window:
    """Up to ``size`` calls sent one after another under one limit, and their answers' latencies.

    ``threshold`` is the latency tolerated by the baseline of the windows before it (infinite when there is none):
    answers are counted against it as they come, so that the window is decided as soon as they leave no doubt."""

    __slots__ = ("size", "unsent", "outstanding", "latencies", "threshold", "slower", "within", "peak",
                 "offers_later", "number", "loads")

    def __init__(self, size: int, threshold: float, in_flight: int, number: int = 0) -> None:
        self.size = size
        self.unsent = size
        self.outstanding = 0
        self.latencies: list[float] = []
        self.threshold = threshold
        self.slower = 0  # answers slower than the threshold
        self.within = 0  # answers within it (none counted while it is infinite)
        self.peak = in_flight
        self.offers_later = False  # decided before all of it was back: offers the baseline its latency once it is
        self.number = number  # the limiter's count of windows when it started
        self.loads = 0.0  # the calls in flight on average while each answered call ran, summed

    @property
    def complete(self) -> bool:
        return self.outstanding == 0 and self.unsent == 0

    def answered(self, latency: float, load: float) -> None:
        """A success of ``latency``, which ran beside ``load`` calls in flight on average (itself included)."""
        self.latencies.append(latency)
        self.loads += load
        if latency > self.threshold:
            self.slower += 1
        elif self.threshold < math.inf:
            self.within += 1

    def decided_slow(self) -> bool:
        """More than ``1 - QUANTILE`` of the window's answers are slower, so its quantile is whatever the calls
        still out do, and significantly many of the answers back so far are. Not a few that came back first: the
        leaders of prefix groups are a batch's first calls out, and its only ones until they are back."""
        return (self.slower > self.size * (1 - QUANTILE)
                and self.slower >= significant(self.slower + self.within, 1 - QUANTILE))

    def decided_within(self) -> bool:
        return self.within >= math.ceil(self.size * QUANTILE)

    def load_and_throughput(self) -> tuple[float, float] | None:
        """The calls in flight while its calls ran, on average, and by Little's law the throughput they made: that
        load over its typical latency. None before an answer."""
        if not self.latencies:
            return None
        load = self.loads / len(self.latencies)
        return load, load / self.quantile()

    def quantile(self) -> float:
        latencies = sorted(self.latencies)
        return latencies[math.ceil(len(latencies) * QUANTILE) - 1]

    def quantile_bound(self) -> float:
        """An upper bound of its ``QUANTILE`` latency at ``SIGNIFICANCE``, but never its slowest answer: a window
        of a few heavy calls and many light ones, or of one heavy call and a few light ones, offers a light
        latency."""
        latencies = sorted(self.latencies)
        return latencies[min(significant(len(latencies), QUANTILE), len(latencies) - 1) - 1]

    def lower_bound(self) -> float:
        """A latency that significantly many of its answers exceed: beyond the tolerated one, the window's
        ``QUANTILE`` is."""
        latencies = sorted(self.latencies)
        return latencies[len(latencies) - significant(len(latencies), 1 - QUANTILE)]
