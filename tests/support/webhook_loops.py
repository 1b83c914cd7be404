"""Webhook delivery loops run by a test in its own process, on a real store: ``running_loops`` runs ``count``
``WebhookDelivery`` loops on an event loop of their own thread, sharing nothing but the store (as the loops of
separate workers do), until the block ends; then stops them and waits for their attempts in flight to end."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from openrelay.catalog import Catalog, parse_catalog
from openrelay.config import Settings, WebhookSettings
from openrelay.store.db import Database
from openrelay.store.schema import webhook_deliveries
from openrelay.store.webhook_endpoints import WebhookEndpoints
from openrelay.store.webhook_log import WebhookLog
from openrelay.store.webhook_outbox import WebhookOutbox
from openrelay.webhooks.delivery import WebhookDelivery
from tests.support.webhook_receiver import Receiver

__all__ = ["WebhookStores", "running_loops", "receiver_catalog", "quick_settings"]


@dataclass(frozen=True)
class WebhookStores:
    """The three webhook repositories of one store, as ``Runtime`` holds them."""

    endpoints: WebhookEndpoints
    outbox: WebhookOutbox
    log: WebhookLog

    @classmethod
    def of(cls, db: Database) -> WebhookStores:
        return cls(WebhookEndpoints(db), WebhookOutbox(db), WebhookLog(db))

    def delivery_states(self, event_id: str) -> dict[str, str]:
        """endpoint id -> state, for one event."""
        d = webhook_deliveries.c
        with self.log.db.read() as conn:
            return dict(conn.execute(sa.select(d.endpoint_id, d.state).where(d.event_id == event_id)).all())


def receiver_catalog(receiver: Receiver) -> Catalog:
    """A catalog whose ``[webhooks] allow`` lets deliveries reach the receiver's /hooks/ on loopback."""
    return parse_catalog(f'[webhooks]\nallow = ["{receiver.base}/hooks/"]\n')


def quick_settings(folder: Path, **webhooks: float) -> Settings:
    """Settings with short polls and retry waits (0.2 s, doubling, up to 1 s), and ``webhooks`` besides."""
    return Settings(data_dir=folder, database_url="unused", webhooks=WebhookSettings(
        **{"poll_seconds": 0.05, "retry_base_seconds": 0.2, "retry_max_seconds": 1.0, **webhooks}))


@contextmanager
def running_loops(store: WebhookStores, catalog: Catalog, settings: Settings, count: int) -> Iterator[None]:
    started = threading.Event()
    running: dict[str, object] = {}

    async def loops() -> None:
        stop = asyncio.Event()
        running.update(loop=asyncio.get_running_loop(), stop=stop)
        started.set()
        await asyncio.gather(*(WebhookDelivery(store.outbox, store.log, catalog, settings).run_forever(stop)
                               for _ in range(count)))

    def run() -> None:
        try:
            asyncio.run(loops())
        except BaseException as exc:  # handed to the test when the block ends
            running["failure"] = exc
            started.set()

    thread = threading.Thread(target=run, name="webhook-loops", daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield
    finally:
        loop, stop = running.get("loop"), running.get("stop")
        if isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop, asyncio.Event):
            loop.call_soon_threadsafe(stop.set)
        thread.join(120)
        assert not thread.is_alive(), "the delivery loops did not stop"
        if "failure" in running:
            raise AssertionError("the delivery loops failed") from running["failure"]  # type: ignore[misc]
