"""The delivery loop every worker process runs beside its batches: claim due deliveries from the outbox
(``WebhookOutbox.claim_due``), post each signed event, record the attempt, retry failures with backoff, and prune
the delivery log. Up to ``OPENRELAY_WEBHOOK_CONCURRENCY`` attempts in flight, none waiting for another; each ends at
its timeout, well before its claim lapses. docs/webhooks.md, "Delivery"."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..backoff import Backoff
from ..catalog import Catalog
from ..clock import now
from ..config import Settings
from ..egress import BlockedAddress
from ..metrics import WEBHOOK_ATTEMPTS
from ..store.webhook_log import PrunedLog, WebhookLog
from ..store.webhook_outbox import DELIVERED, DueDelivery, WebhookOutbox
from .network import webhook_client
from .signing import signed_headers

__all__ = ["WebhookDelivery", "Attempt", "retry_backoff", "prune_period", "prune_delivery_log"]

log = logging.getLogger("openrelay.webhooks")

_CLAIM_LIMIT = 32  # deliveries one claim takes at most
_PRUNE_EVERY_SECONDS = 3600.0
_MAX_ERROR_CHARS = 500


@dataclass(frozen=True, kw_only=True)
class Attempt:
    event_id: str
    endpoint_id: str
    delivery_id: str
    attempt: int
    outcome: str  # delivered | failed | refused
    status_code: int | None
    error: str | None
    state: str  # the delivery's state after it: delivered, pending (to be retried), failed (given up), removed

    def as_json(self) -> dict[str, object]:
        return {"delivery_id": self.delivery_id, "event_id": self.event_id, "endpoint_id": self.endpoint_id,
                "attempt": self.attempt, "outcome": self.outcome, "status_code": self.status_code,
                "error": self.error, "delivery_state": self.state}


def retry_backoff(settings: Settings) -> Backoff:
    """The waits after failed attempts: the base, doubling, capped, each stretched by up to a quarter (never past
    the cap), so that the events of a receiver that went down are not all retried in the same instant."""
    return Backoff(base=settings.webhooks.retry_base_seconds, cap=settings.webhooks.retry_max_seconds,
                   jitter=(1.0, 1.25))


def prune_period(settings: Settings) -> float:
    """How often a loop prunes the log: hourly, or as often as the log's age when that is shorter (tests)."""
    return min(_PRUNE_EVERY_SECONDS, settings.webhooks.log_keep_seconds)


def prune_delivery_log(webhook_log: WebhookLog, settings: Settings) -> PrunedLog:
    """One pruning of the delivery log past its age (``OPENRELAY_WEBHOOK_LOG_KEEP_SECONDS``)."""
    pruned = webhook_log.prune_delivery_log(older_than=settings.webhooks.log_keep_seconds)
    if pruned.attempts or pruned.deliveries or pruned.events:
        log.info("webhook log pruned: %d attempts, %d deliveries, %d events", pruned.attempts, pruned.deliveries,
                 pruned.events)
    return pruned


class WebhookDelivery:
    def __init__(self, outbox: WebhookOutbox, webhook_log: WebhookLog, catalog: Catalog, settings: Settings) -> None:
        self.outbox = outbox
        self.webhook_log = webhook_log
        self.catalog = catalog
        self.settings = settings

    @property
    def hold_seconds(self) -> float:
        """How long a claim keeps other loops off a delivery: its attempt's timeout, counted from before the claim,
        and as long again (plus a second) to record the outcome. A loop that died holding it is followed by a
        resend after this."""
        return 2 * self.settings.webhooks.timeout_seconds + 1

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Claim and send until ``stop`` is set: again as soon as something was claimed or an attempt ended, else
        every ``poll_seconds``. The log is pruned at the start and then every ``prune_period``, beside the
        deliveries. Once stopped, the attempts in flight end (within the timeout) and are recorded."""
        flying: set[asyncio.Task[None]] = set()
        pruning: asyncio.Task[None] | None = None
        pruned_at = -float("inf")
        while not stop.is_set():
            if (pruning is None or pruning.done()) and time.monotonic() - pruned_at >= prune_period(self.settings):
                pruned_at = time.monotonic()
                pruning = asyncio.create_task(self._prune())
            claimed_at = asyncio.get_running_loop().time()
            room = self.settings.webhooks.concurrency - len(flying)
            claimed = await self._claim(room) if room > 0 else []
            for due in claimed:
                task = asyncio.create_task(self._send(due, claimed_at))
                flying.add(task)
                task.add_done_callback(flying.discard)
            if claimed and len(flying) < self.settings.webhooks.concurrency:
                continue
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({stopped, *flying}, timeout=self.settings.webhooks.poll_seconds,
                               return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
        await asyncio.gather(*flying, return_exceptions=True)

    async def _send(self, due: DueDelivery, claimed_at: float) -> None:
        try:
            await self.deliver(due, claimed_at=claimed_at)
        except Exception:  # the store went away before the outcome was written: the claim lapses, it is resent
            log.exception("webhook %s to %s: the attempt could not be recorded", due.event_id, due.url)

    async def _prune(self) -> None:
        try:
            await asyncio.to_thread(prune_delivery_log, self.webhook_log, self.settings)
        except Exception:  # the store is away: the next period tries again
            log.exception("webhook log pruning failed")

    async def _claim(self, room: int) -> list[DueDelivery]:
        """What is due now, up to ``room``; nothing while the store is away."""
        try:
            return await asyncio.to_thread(
                self.outbox.claim_due, limit=min(room, _CLAIM_LIMIT), hold_seconds=self.hold_seconds,
                endpoint_concurrency=self.settings.webhooks.endpoint_concurrency,
                rotation_overlap=self.settings.webhooks.rotation_overlap_seconds)
        except Exception:  # the store is away: the next poll tries again
            log.exception("webhook delivery: claiming failed")
            return []

    async def deliver(self, due: DueDelivery, *, retry: bool = True, claimed_at: float | None = None) -> Attempt:
        """Send one claimed delivery and record the attempt; without ``retry`` a failure is final (the
        operator's test event). The attempt ends at the timeout after ``claimed_at`` (the event loop's clock
        before the claim was taken; now when not given)."""
        started = asyncio.get_running_loop().time()
        deadline = (started if claimed_at is None else claimed_at) + self.settings.webhooks.timeout_seconds
        outcome, status_code, error = await self._post(due, deadline)
        duration_ms = int((asyncio.get_running_loop().time() - started) * 1000)
        state = await asyncio.to_thread(
            self.outbox.record_attempt, due, outcome=outcome, status_code=status_code, error=error,
            duration_ms=duration_ms, backoff=retry_backoff(self.settings), retry=retry,
            give_up_after=self.settings.webhooks.give_up_seconds)
        WEBHOOK_ATTEMPTS.labels(outcome).inc()
        if outcome != DELIVERED:
            log.warning("webhook %s to %s (attempt %d): %s; delivery %s", due.event_id, due.url, due.attempt,
                        error, state)
        return Attempt(event_id=due.event_id, endpoint_id=due.endpoint_id, delivery_id=due.delivery_id,
                       attempt=due.attempt, outcome=outcome,
                       status_code=status_code, error=error, state=state)

    async def _post(self, due: DueDelivery, deadline: float) -> tuple[str, int | None, str | None]:
        """(outcome, status code, error) of one POST, over by ``deadline`` whatever the endpoint does. Only a 2xx
        delivers; the answer's body is never read."""
        timeout = self.settings.webhooks.timeout_seconds
        headers = signed_headers(due.signing_secrets, due.event_id, due.payload, now())
        try:
            async with (asyncio.timeout_at(deadline),
                        webhook_client(due.url, self.catalog, timeout) as client,
                        client.stream("POST", due.url, content=due.payload, headers=headers) as response):
                status_code = response.status_code
        except TimeoutError:
            return "failed", None, f"no answer within the timeout ({timeout:g} s)"
        except Exception as exc:
            blocked = _found_blocked(exc)
            if blocked is not None:
                return "refused", None, f"not sent: the endpoint's host {blocked}"[:_MAX_ERROR_CHARS]
            return "failed", None, f"{exc.__class__.__name__}: {exc or 'no detail'}"[:_MAX_ERROR_CHARS]
        if 200 <= status_code < 300:
            return DELIVERED, status_code, None
        return "failed", status_code, f"the endpoint answered {status_code}"


def _found_blocked(exc: BaseException) -> BlockedAddress | None:
    """The ``BlockedAddress`` behind ``exc`` (the HTTP client wraps what its connection raised)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BlockedAddress):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
