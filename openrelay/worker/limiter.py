"""The adaptive concurrency limiter of ``concurrency = "auto"``: how many calls one worker process sends to one
engine replica at once, found from the engine's answers (AIMD on latency; docs/engines.md, "Adaptive concurrency").

A window is ``max(limit, MIN_WINDOW)`` calls sent one after another under one limit; it is judged once all of them
are back (so a window of short and long calls is not judged on its short ones). Measured against the baseline (the
lowest recent window), a window beyond ``tolerance`` and beyond its own noise shrinks the limit in proportion; one
within it grows the limit, if every slot was taken at some point. A 429 or 503 shrinks it at once, once per round.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from enum import StrEnum

__all__ = ["ConcurrencyLimiter", "Outcome", "Slot", "Token", "initial_limit", "outcome_for_status"]

TOLERANCE = 0.2  # a window up to 20% slower than the baseline still counts as the engine keeping up
CONFIDENCE = 2.0  # standard errors: a window is judged slower only when it is slower beyond its own noise
MIN_WINDOW = 8  # answers a window needs at the least, so that a low limit is not judged on one or two calls
BASELINE_WINDOWS = 128  # the baseline forgets a window after this many more: a workload that got slower is relearnt
LATENCY_BACKOFF = (0.5, 0.9)  # a slow window multiplies the limit by tolerated/observed, held within these bounds
OVERLOAD_BACKOFF = 0.8  # what a 429/503 multiplies the limit by


class Outcome(StrEnum):
    SUCCESS = "success"  # the engine answered: a latency sample
    OVERLOAD = "overload"  # 429 or 503, or no answer within the timeout: back off
    ERROR = "error"  # any other failure (a 4xx, a refused connection): frees the slot, tells nothing
    IGNORE = "ignore"  # the call was cancelled before its answer: frees the slot, tells nothing


def outcome_for_status(status_code: int) -> Outcome:
    """What an engine's HTTP answer tells the limiter. 408 and 504 are timeouts, which count as overload."""
    if 200 <= status_code < 300:
        return Outcome.SUCCESS
    if status_code in (408, 429, 503, 504):
        return Outcome.OVERLOAD
    return Outcome.ERROR


def initial_limit(min_limit: int, max_limit: int) -> int:
    """Where a new limiter starts: 4, or the nearest bound."""
    return min(max(min_limit, 4), max_limit)


class Token:
    """One slot taken: when its call was sent, and the window measuring it (or None)."""

    __slots__ = ("sent", "window", "released")

    def __init__(self, sent: float, window: int | None) -> None:
        self.sent = sent
        self.window = window
        self.released = False


class ConcurrencyLimiter:
    """Slots for the calls to one engine replica, granted first come, first served. One event loop, no threads.

    ``on_change`` is called with the new limit each time it changes (a Prometheus gauge's ``set``)."""

    def __init__(self, min_limit: int, max_limit: int, initial: int | None = None, *,
                 tolerance: float = TOLERANCE, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[int], None] | None = None) -> None:
        if not 1 <= min_limit <= max_limit:
            raise ValueError("need 1 <= min_limit <= max_limit")
        start = initial_limit(min_limit, max_limit) if initial is None else initial
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.tolerance = tolerance
        self.on_change = on_change
        self._clock = clock
        self._estimate = float(min(max(start, min_limit), max_limit))
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[Token]] = deque()
        self._slow_start = True  # double per good window until the engine first pushes back, as TCP does
        self._streak = 0  # good windows in a row since the last back-off: the next growth step
        self._ceiling = math.inf  # the limit the engine last pushed back at: approached by halving the way there
        # The latest windows' latency (noise added) that are lower than every later one, as (window, latency):
        # its head is the lowest of the last BASELINE_WINDOWS, kept in O(1) a window.
        self._lows: deque[tuple[int, float]] = deque()
        self._backed_off = -math.inf  # when the limit last shrank: overloads of calls sent before are old news
        self._window = 0
        self._start_window()

    @property
    def limit(self) -> int:
        return int(self._estimate)

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
        self._in_flight -= 1
        if outcome is Outcome.OVERLOAD and token.sent >= self._backed_off:
            ceiling = self._estimate
            self._set_estimate(ceiling * OVERLOAD_BACKOFF)
            self._back_off(ceiling)
        elif token.window == self._window:
            self._outstanding -= 1
            if outcome is Outcome.SUCCESS:
                latency = (self._clock() - token.sent) / max(work, 1e-9)
                self._count += 1
                self._latency_sum += latency
                self._latency_squares += latency * latency
            if self._outstanding == 0 and self._unsent == 0:
                self._close_window()
        self._wake_waiters()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        """``async with limiter.slot() as slot: reply = await send(); slot.report(outcome_for_status(...))``.
        Without a report the slot counts as a success if the block ends normally, an error if it raises and is
        ignored if it is cancelled."""
        held = Slot(await self.acquire())
        outcome = Outcome.SUCCESS
        try:
            yield held
        except asyncio.CancelledError:
            outcome = Outcome.IGNORE
            raise
        except BaseException:
            outcome = Outcome.ERROR
            raise
        finally:
            self.release(held.token, held.outcome or outcome, held.work)

    def _grant(self) -> Token:
        self._in_flight += 1
        if self._unsent == 0:
            return Token(self._clock(), None)  # the window has its calls; this one is not measured
        self._unsent -= 1
        self._outstanding += 1
        self._peak = max(self._peak, self._in_flight)
        return Token(self._clock(), self._window)

    def _wake_waiters(self) -> None:
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter is skipped here rather than searched for when it leaves
                waiter.set_result(self._grant())

    def _start_window(self) -> None:
        self._window += 1  # calls of earlier windows, out still, no longer count
        self._unsent = max(MIN_WINDOW, self.limit)
        self._outstanding = 0
        self._count = 0
        self._latency_sum = 0.0
        self._latency_squares = 0.0
        self._peak = self._in_flight

    def _close_window(self) -> None:
        if self._count < 2:  # all failed: nothing to judge
            self._start_window()
            return
        average = self._latency_sum / self._count
        variance = max(0.0, self._latency_squares / self._count - average * average)
        noise = CONFIDENCE * math.sqrt(variance / (self._count - 1))
        tolerated = self._baseline(average + noise) * (1 + self.tolerance)
        if average - noise > tolerated:
            low, high = LATENCY_BACKOFF
            ceiling = min(self._estimate, self._peak)
            self._set_estimate(ceiling * min(high, max(low, tolerated / (average - noise))))
            self._back_off(ceiling)
            return
        if average <= tolerated and self._peak >= self.limit:  # an idle slot says nothing about the engine
            self._streak += 1
            self._set_estimate(self._estimate * 2 if self._slow_start else self._estimate + self._growth_step())
        self._start_window()

    def _baseline(self, latency: float) -> float:
        """The lowest latency of the last ``BASELINE_WINDOWS`` windows, this one's included."""
        while self._lows and self._lows[-1][1] >= latency:
            self._lows.pop()
        self._lows.append((self._window, latency))
        if self._lows[0][0] <= self._window - BASELINE_WINDOWS:
            self._lows.popleft()
        return self._lows[0][1]

    def _growth_step(self) -> float:
        """One more call per good window in a row (growth speeds up while the engine keeps up), but below the
        ceiling at most half the way to it, so that the limit dwells near where the engine pushed back."""
        gap = self._ceiling - self._estimate
        return min(self._streak, max(1.0, gap / 2)) if gap > 0 else self._streak

    def _back_off(self, ceiling: float) -> None:
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


class Slot:
    """A slot held by ``ConcurrencyLimiter.slot``; ``report`` says how its call went."""

    __slots__ = ("token", "outcome", "work")

    def __init__(self, token: Token) -> None:
        self.token = token
        self.outcome: Outcome | None = None
        self.work = 1.0

    def report(self, outcome: Outcome, work: float = 1.0) -> None:
        self.outcome = outcome
        self.work = work
