"""How the dashboard shows things: the template environment and the small derived views its pages draw
(durations, relative times, money through ``money.usd_text``, tag chip colours, progress segments, answers in
words). No rule lives here: every number comes from the batch object the service returned."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..clock import seconds
from ..money import usd_text
from ..types import CANCELLABLE, TERMINAL, Batch, shown_status, tag_list
from .answers import answer_text

__all__ = ["templates", "BatchView", "chip_colour", "STATIC_DIR", "CHIP_COLOURS"]

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
CHIP_COLOURS = 12  # dashboard.css defines .chip-0 .. .chip-11, each a light fill under dark text (contrast >= 7)


def chip_colour(tag: str) -> int:
    """The colour of a tag's chip, from its text alone: the same on every page, every load, every server."""
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:4], "big") % CHIP_COLOURS


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def relative(stamp: int | None, now: float | None = None) -> str:
    """``stamp`` from ``now``: "5m 02s ago", "just now" within five seconds either way, "in 23h 59m" ahead."""
    if stamp is None:
        return "—"
    ago = int((now or seconds()) - stamp)
    if abs(ago) < 5:
        return "just now"
    return f"{duration(ago)} ago" if ago > 0 else f"in {duration(-ago)}"


def exact(stamp: int | None) -> str:
    if stamp is None:
        return ""
    return dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(stamp: int | None) -> str:
    return "" if stamp is None else dt.datetime.fromtimestamp(stamp, dt.UTC).isoformat()


def tokens(count: int | None) -> str:
    return f"{count or 0:,}"


def pretty_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


@dataclass(frozen=True)
class BatchView:
    """One batch as the pages draw it."""

    batch: Batch
    now: float
    progress: dict[str, Any]  # its openrelay numbers (service/progress.py), as the API shows them

    @property
    def status(self) -> str:
        return shown_status(self.batch.status, self.batch.in_progress_at)

    @property
    def ongoing(self) -> bool:
        return self.batch.status not in TERMINAL

    @property
    def cancellable(self) -> bool:
        return self.batch.status in CANCELLABLE

    @property
    def tags(self) -> list[tuple[str, int]]:
        return [(t, chip_colour(t)) for t in tag_list(self.batch.metadata)]

    @property
    def other_metadata(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in (self.batch.metadata or {}).items() if k != "tags"]

    @property
    def ended_at(self) -> int | None:
        b = self.batch
        return b.completed_at or b.failed_at or b.expired_at or b.cancelled_at

    @property
    def queue_wait(self) -> float | None:
        b = self.batch
        if b.in_progress_at is not None:
            return b.in_progress_at - b.created_at
        if self.ongoing:
            return self.now - b.created_at
        return None

    @property
    def run_time(self) -> float | None:
        b = self.batch
        if b.in_progress_at is None:
            return None
        return (self.ended_at or self.now) - b.in_progress_at

    def percent(self, part: int) -> float:
        return 0.0 if not self.batch.total else round(100.0 * part / self.batch.total, 2)

    @property
    def timeline(self) -> list[tuple[str, int | None, str, bool]]:
        """(step, when, how long since the step before, whether it has happened): created, started, finalizing,
        the terminal status; while the batch is live, the end of its window, ahead, with no time since."""
        b = self.batch
        steps: list[tuple[str, int | None]] = [("created", b.created_at), ("started", b.in_progress_at)]
        if b.cancelling_at:
            steps.append(("cancelling", b.cancelling_at))
        steps.append(("finalizing", b.finalizing_at))
        terminal = next(((name, at) for name, at in (("completed", b.completed_at), ("failed", b.failed_at),
                                                     ("expired", b.expired_at), ("cancelled", b.cancelled_at))
                         if at), None)
        steps.append(terminal or ("window ends", b.expires_at))
        shown: list[tuple[str, int | None, str, bool]] = []
        previous: int | None = None
        for name, at in steps:
            if at is None or at > self.now:
                shown.append((name, at, "", False))
                continue
            shown.append((name, at, duration(at - previous) if previous is not None and at >= previous else "", True))
            previous = at
        return shown


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(duration=duration, relative=relative, exact=exact, iso=iso, usd=usd_text, tokens=tokens,
                       pretty_json=pretty_json, chip_colour=chip_colour,
                       answer_text=answer_text)
    return env


templates = _environment()
