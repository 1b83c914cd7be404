"""The delivery loop every worker process runs beside its batches: claim due deliveries from the outbox, post
each signed event, record the attempt, and come back for failures with an exponential backoff.

Any number of loops on any number of machines share the outbox through the store's claims
(``WebhookOutbox.claim_due``); a loop holds nothing the store does not. ``deliver_due`` does one round and
returns what it did, so a test or an operator can drain the outbox without a loop. The loop also prunes the
delivery log past ``log_keep_seconds`` (``prune_delivery_log``), at most once per ``prune_period``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..backoff import Backoff
from ..catalog import Catalog
from ..config import Settings
from ..egress import BlockedAddress
from ..metrics import WEBHOOK_ATTEMPTS
from ..store.webhook_log import PrunedLog
from ..store.webhook_outbox import DELIVERED, DueDelivery
from ..store.webhooks import WebhookStore
from .network import webhook_client
from .signing import signed_headers

__all__ = ["WebhookDelivery", "Attempt", "retry_backoff", "retry_delay", "prune_period", "prune_delivery_log"]

log = logging.getLogger("openrelay.webhooks")

_CLAIM_LIMIT = 32  # deliveries one round takes at most; they are sent concurrently
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


def retry_delay(settings: Settings, attempt: int) -> float:
    """The wait after failed attempt number ``attempt`` (1 for the first) before its jitter: the least it waits."""
    return retry_backoff(settings).nominal(attempt)


def prune_period(settings: Settings) -> float:
    """How often a loop prunes the log: hourly, or as often as the log's age when that is shorter (tests)."""
    return min(_PRUNE_EVERY_SECONDS, settings.webhooks.log_keep_seconds)


def prune_delivery_log(store: WebhookStore, settings: Settings) -> PrunedLog:
    """One pruning of the delivery log past its age (``OPENRELAY_WEBHOOK_LOG_KEEP_SECONDS``)."""
    pruned = store.prune_delivery_log(older_than=settings.webhooks.log_keep_seconds)
    if pruned.attempts or pruned.deliveries or pruned.events:
        log.info("webhook log pruned: %d attempts, %d deliveries, %d events", pruned.attempts, pruned.deliveries,
                 pruned.events)
    return pruned


class WebhookDelivery:
    def __init__(self, store: WebhookStore, catalog: Catalog, settings: Settings) -> None:
        self.store = store
        self.catalog = catalog
        self.settings = settings

    @property
    def hold_seconds(self) -> float:
        """How long a claim keeps other loops off a delivery: its attempt's timeout, and as long again (plus a
        second) to record the outcome. A loop that died holding it is followed by a resend after this."""
        return 2 * self.settings.webhooks.timeout_seconds + 1

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Round after round until ``stop`` is set; a round that found work is followed at once by the next.
        The log is pruned at the start and then every ``prune_period``."""
        pruned_at = -float("inf")
        while not stop.is_set():
            done: list[Attempt] = []
            try:
                if time.monotonic() - pruned_at >= prune_period(self.settings):
                    pruned_at = time.monotonic()
                    await asyncio.to_thread(prune_delivery_log, self.store, self.settings)
                done = await self.deliver_due()
            except Exception:  # the store is away: the next round tries again
                log.exception("webhook delivery round failed")
            if done:
                continue
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.settings.webhooks.poll_seconds)
            except TimeoutError:
                pass

    async def deliver_due(self) -> list[Attempt]:
        """Claim what is due now and send it, concurrently; the attempts made."""
        claimed = await asyncio.to_thread(self.store.claim_due, limit=_CLAIM_LIMIT, hold_seconds=self.hold_seconds,
                                          rotation_overlap=self.settings.webhooks.rotation_overlap_seconds)
        return list(await asyncio.gather(*(self.deliver(due) for due in claimed)))

    async def deliver(self, due: DueDelivery, *, retry: bool = True) -> Attempt:
        """Send one claimed delivery and record the attempt; without ``retry`` a failure is final (the
        operator's test event)."""
        started = time.monotonic()
        outcome, status_code, error = await self._post(due)
        duration_ms = int((time.monotonic() - started) * 1000)
        state = await asyncio.to_thread(
            self.store.record_attempt, due, outcome=outcome, status_code=status_code, error=error,
            duration_ms=duration_ms, retry_in=retry_backoff(self.settings).delay(due.attempt) if retry else None,
            give_up_after=self.settings.webhooks.give_up_seconds)
        WEBHOOK_ATTEMPTS.labels(outcome).inc()
        if outcome != DELIVERED:
            log.warning("webhook %s to %s (attempt %d): %s; delivery %s", due.event_id, due.url, due.attempt,
                        error, state)
        return Attempt(event_id=due.event_id, endpoint_id=due.endpoint_id, delivery_id=due.delivery_id,
                       attempt=due.attempt, outcome=outcome,
                       status_code=status_code, error=error, state=state)

    async def _post(self, due: DueDelivery) -> tuple[str, int | None, str | None]:
        """(outcome, status code, error) of one POST. Only a 2xx delivers; the answer's body is never read."""
        headers = signed_headers(due.signing_secrets, due.event_id, due.payload, int(time.time()))
        try:
            async with (webhook_client(due.url, self.catalog, self.settings.webhooks.timeout_seconds) as client,
                        client.stream("POST", due.url, content=due.payload, headers=headers) as response):
                status_code = response.status_code
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
