"""The adaptive concurrency limiter of ``concurrency = "auto"``: how many calls one worker process sends to one
engine replica at once, found from the engine's answers (AIMD on latency, a window of calls at a time, with a
throughput check in slow start; how and why: docs/engines.md, "Adaptive concurrency")."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .latency_window import Window
from .outcome import Outcome

__all__ = ["ConcurrencyLimiter", "Token"]

# The numbers below, and why each is what it is, are explained in docs/engines.md.
TOLERANCE = 0.2  # a window's typical call up to 20% slower than the baseline still counts as the engine keeping up
MIN_WINDOW = 12  # calls a window has at the least
SLOW_START_WINDOW = 6  # ... until the engine first pushes back, so that a rise is seen within a round of calls
MIN_ANSWERS = 4  # answers a window needs to offer the baseline its latency; the first window, at the bottom, has these
PROBE_STEP = 1 / 16  # below the limit it last backed off from, a low limit grows by at least this share of itself
BASELINE_WINDOWS = 256  # the baseline forgets a window after this many more: a workload that got slower is relearnt
LATENCY_BACKOFF = (0.5, 0.9)  # a slow window multiplies the limit by tolerated/observed, held within these bounds
OVERLOAD_BACKOFF = 0.8  # what an overload or a timeout (``Outcome.backs_off``) multiplies the limit by
# In slow start a window judged slower does not end it while its throughput rose at least this fast against its load
# (d log throughput / d log load), over a load MIN_LOAD_GAIN to MAX_LOAD_GAIN times the last window's, and its
# latency is at most CONTENTION_RISE times the baseline: contention that more calls still pay for, not the knee.
THROUGHPUT_ELASTICITY = 0.7
MIN_LOAD_GAIN, MAX_LOAD_GAIN = 1.25, 3.0
CONTENTION_RISE = 1.5


@dataclass(slots=True)
class Token:
    """One slot taken: when its call was sent, and the window measuring it (or None)."""

    sent: float
    window: Window | None
    busy: float = 0.0  # the limiter's integral of its calls in flight over time when it was sent
    released: bool = False


class ConcurrencyLimiter:
    """Slots for the calls to one engine replica, granted first come, first served. One event loop, no threads.
    ``on_change`` is called with the new limit each time it changes (a Prometheus gauge's ``set``)."""

    def __init__(self, min_limit: int, max_limit: int, initial: int | None = None, *,
                 baseline: float | None = None, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[int], None] | None = None) -> None:
        """``initial`` and ``baseline``: where an earlier limiter of the replica left off (``learnt``): it starts
        there, past its slow start, as if the engine had pushed back one call above ``initial``."""
        if not 1 <= min_limit <= max_limit:
            raise ValueError("need 1 <= min_limit <= max_limit")
        start = min_limit if initial is None else initial  # at the bottom: the unloaded latency is measured first
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.on_change = on_change
        self._clock = clock
        self._estimate = float(min(max(start, min_limit), max_limit))
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[Token]] = deque()
        self._slow_start = True  # double per good window until the engine first pushes back, as TCP does
        self._streak = 0  # good windows in a row since the last back-off: the next growth step
        self._ceiling = math.inf  # the limit the engine last pushed back at: approached by halving the way there
        # (window number, latency bound) of the windows lower than every later one: the head is the baseline
        self._lows: deque[tuple[int, float]] = deque()
        self._backed_off = -math.inf  # when the limit last shrank: overloads of calls sent before are old news
        self._windows = 0  # windows started so far
        self._filling: Window | None = None  # a window decided before all its calls were out: they go first
        self._last_baseline = baseline  # the latest baseline measured (or learnt), kept across a relearning
        self._previous: tuple[float, float] | None = None  # slow start: the last window judged, its load and throughput
        self._busy = 0.0  # the integral of the calls in flight over time, up to _busy_at
        self._busy_at = self._clock()
        self._rebased = 0  # windows started before this one no longer offer the baseline their latency
        self._kept_up = self.limit  # the limit of the last window the engine kept up with (lowered by back-offs)
        if baseline is not None and initial is not None:
            self._lows.append((0, baseline))
            self._slow_start = False
            self._ceiling = self._estimate + 1  # it dwells at the learnt limit, probing as after a back-off
        self._window = self._start_window()

    @property
    def limit(self) -> int:
        return int(self._estimate)

    def learnt(self) -> tuple[int, float] | None:
        """(limit, baseline) for a later limiter of the replica to start from, once the baseline is measured and the
        engine kept up with more than the lowest limit (None before). The limit is the last one the engine kept up
        with, not a probe above it; while the first climb goes on, as high as it got with every answer in time."""
        if self._last_baseline is None or (self._slow_start and self._kept_up <= self.min_limit):
            return None
        return self._kept_up, self._last_baseline

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def acquire(self) -> Token:
        """A slot, once fewer than ``limit`` calls are in flight and every earlier caller has had one."""
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()  # cancelled while waiting
        if self._in_flight < self.limit and not self._waiters:
            return self._grant()
        waiter: asyncio.Future[Token] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result(), Outcome.IGNORE)  # granted as the caller was cancelled: give it back
            raise

    def release(self, token: Token, outcome: Outcome, work: float = 1.0) -> None:
        """Frees the token's slot and learns from how its call went. A success's latency runs from ``token.sent``
        to now, divided by ``work`` (1, or for instance the answer's tokens, so that long and short answers
        compare)."""
        if token.released:
            raise RuntimeError("limiter token released twice")
        token.released = True
        window = token.window
        now, busy = self._count_in_flight(-1)
        latency = (now - token.sent) / max(work, 1e-9)
        if window is not None:
            window.outstanding -= 1
            if outcome is Outcome.SUCCESS:
                load = (busy - token.busy) / (now - token.sent) if now > token.sent else self._in_flight + 1
                window.answered(latency, load)
        if outcome is Outcome.SUCCESS and self._slow_start and self._lows and self._in_flight + 1 >= self.limit \
                and latency <= (1 + TOLERANCE) * self._recent_low():
            self._kept_up = max(self._kept_up, self.limit)
            self._set_estimate(self._estimate + 1)  # every slot was taken and the engine kept up
        if outcome.backs_off and token.sent >= self._backed_off:
            ceiling = self._estimate
            self._set_estimate(ceiling * OVERLOAD_BACKOFF)
            self._back_off(ceiling)
        elif window is self._window:
            self._judge_window()
            if self._slow_start and self._window is not window:
                self._previous = window.load_and_throughput() or self._previous
        elif window is not None and window.offers_later and window.complete:
            self._offer_baseline(window)
        self._wake_waiters()

    def _count_in_flight(self, change: int) -> tuple[float, float]:
        """Counts ``change`` calls more in flight from now on; returns now, and the integral of the calls in flight
        over time up to now."""
        now = self._clock()
        self._busy += self._in_flight * (now - self._busy_at)
        self._busy_at = now
        self._in_flight += change
        return now, self._busy

    def _grant(self) -> Token:
        now, busy = self._count_in_flight(+1)
        window = self._filling or self._window
        if window.unsent == 0:
            return Token(now, None)  # the window has its calls; this one is not measured
        window.unsent -= 1
        window.outstanding += 1
        window.peak = max(window.peak, self._in_flight)
        if window is self._filling and window.unsent == 0:
            self._filling = None
        return Token(now, window, busy)

    def _wake_waiters(self) -> None:
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter is skipped here rather than searched for when it leaves
                waiter.set_result(self._grant())

    def _start_window(self) -> Window:
        """A new window (calls of an undecided earlier one, out still, no longer count)."""
        self._windows += 1
        least = MIN_WINDOW if not self._slow_start else SLOW_START_WINDOW if self._lows else MIN_ANSWERS
        self._window = Window(max(least, self.limit), (1 + TOLERANCE) * self._recent_low(), self._in_flight,
                              self._windows)
        return self._window

    def _judge_window(self) -> None:
        """Decides the current window once the answers back leave no doubt (the calls still out could only add
        answers on both sides), or once all of it is back, then starts the next."""
        window = self._window
        used = window.peak >= self.limit  # an idle slot says nothing about the engine
        if window.decided_slow():
            self._decided(window)
            self._slow_window(window, window.threshold)
        elif window.decided_within() and used:
            self._decided(window)
            self._grow()
        elif window.complete:
            if len(window.latencies) < 2:  # all failed: nothing to judge
                self._start_window()
                return
            tolerated = (1 + TOLERANCE) * self._offer_baseline(window)  # the baseline this window may lower
            typical = window.quantile()
            if window.lower_bound() > tolerated or (typical > tolerated and self.limit <= self.min_limit):
                self._slow_window(window, tolerated)
            elif typical <= tolerated and used:
                self._grow()
            else:
                self._start_window()

    def _decided(self, window: Window) -> None:
        """The window's verdict is taken before all of it is back. It still gets all its calls (before the next
        window's), and offers its latency to the baseline once they are back (why: docs/engines.md)."""
        if window.complete:
            self._offer_baseline(window)
            return
        window.offers_later = True
        if window.unsent:
            self._filling = window

    def _slow_window(self, window: Window, tolerated: float) -> None:
        """Load slows the engine: the limit shrinks (from what was really in flight) by tolerated / observed. Or the
        baseline starts over: at the lowest limit, with no load of ours to shed, the next window measures it (not
        this one, picked for being slow); in slow start, once, from a window whose throughput still rose, whose
        latency is the baseline from then on (the windows before it offer theirs no more)."""
        at_bottom = self.limit <= self.min_limit
        if at_bottom or (self._slow_start and not self._rebased and self._throughput_rose(window)):
            self._kept_up = self.limit
            self._lows.clear()
            window.offers_later = False
            if at_bottom:
                self._ceiling = math.inf  # found against the old baseline
            else:
                self._lows.append((self._windows, window.quantile_bound()))
                self._last_baseline = self._recent_low()
                self._rebased = self._windows + 1
            self._start_window()
            return
        low, high = LATENCY_BACKOFF
        ceiling = min(self._estimate, window.peak)
        self._set_estimate(ceiling * min(high, max(low, tolerated / window.quantile())))
        self._back_off(ceiling)

    def _throughput_rose(self, window: Window) -> bool:
        measured = window.load_and_throughput()
        if measured is None or self._previous is None:
            return False
        (load, throughput), (load_before, throughput_before) = measured, self._previous
        if window.quantile() > CONTENTION_RISE * self._recent_low():
            return False
        if not MIN_LOAD_GAIN * load_before <= load <= MAX_LOAD_GAIN * load_before or throughput <= throughput_before:
            return False
        return math.log(throughput / throughput_before) >= THROUGHPUT_ELASTICITY * math.log(load / load_before)

    def _grow(self) -> None:
        self._kept_up = self.limit
        if self._slow_start:
            if self._window.threshold == math.inf:
                self._set_estimate(self._estimate * 2)  # the bottom measured: answers grow it from now on
        else:
            if self._estimate >= self._ceiling:  # past where the engine last pushed back, and it keeps up
                self._ceiling = math.inf
                self._streak = 0
            self._streak += 1
            # One more call per good window in a row, but below the ceiling at most half the way to it, and at the
            # least one call or, below 16, PROBE_STEP of the limit.
            least = min(1.0, self._estimate * PROBE_STEP)
            self._set_estimate(self._estimate + min(self._streak, max(least, (self._ceiling - self._estimate) / 2)))
        self._start_window()

    def _offer_baseline(self, window: Window) -> float:
        """Offers a window that is all back to the baseline; returns the baseline."""
        if len(window.latencies) >= MIN_ANSWERS and window.number >= self._rebased:
            latency = window.quantile_bound()
            while self._lows and self._lows[-1][1] >= latency:
                self._lows.pop()
            self._lows.append((self._windows, latency))
            self._last_baseline = self._recent_low()
        return self._recent_low()

    def _recent_low(self) -> float:
        """The baseline: the lowest bound of the last ``BASELINE_WINDOWS`` windows (infinite before the first)."""
        while self._lows and self._lows[0][0] <= self._windows - BASELINE_WINDOWS:
            self._lows.popleft()
        return self._lows[0][1] if self._lows else math.inf

    def _back_off(self, ceiling: float) -> None:
        self._kept_up = min(self._kept_up, self.limit)
        self._ceiling = ceiling
        self._slow_start = False
        self._streak = 0
        self._backed_off = self._clock()
        self._start_window()

    def _set_estimate(self, value: float) -> None:
        before = self.limit
        self._estimate = min(max(value, float(self.min_limit)), float(self.max_limit))
        if self.limit != before and self.on_change is not None:
            self.on_change(self.limit)
