"""``orl serve`` and ``orl worker``: the processes. Serve hosts the API, the scheduler and a worker in one
event loop; they still talk only through the store, exactly as separate processes would. A process that runs a
worker also runs a llama-server child for each llama-cpp model (engines/llama_child.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from . import tracing
from .api.app import create_app
from .api.http_protocol import limited_http_protocol
from .config import Settings
from .engines.llama_child import children_of, supervising
from .http.writes import OrgWrites
from .runtime import Runtime, open_runtime
from .web.routes import UPLOAD_PATHS, mount_dashboard
from .webhooks.delivery import WebhookDelivery
from .worker.sweeper import Sweeper
from .worker.worker import Worker

__all__ = ["serve", "run_worker", "bootstrap", "assemble_app"]

log = logging.getLogger("openrelay")


def bootstrap(rt: Runtime) -> None:
    """On an empty store: organization ``default`` and a key with every scope, written to the data dir."""
    if rt.accounts.list_orgs():
        return
    org = rt.accounts.create_org("default")
    _key, secret = rt.accounts.create_key(org.id)
    path: Path = rt.settings.data_dir / "api-key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    os.chmod(path, 0o600)
    print(f"openrelay: created organization 'default' and an API key with every scope; it is in {path}",
          file=sys.stderr)


def assemble_app(rt: Runtime) -> FastAPI:
    """The API and, beside it, the dashboard's pages (openrelay/web: HTML, outside the OpenAPI document), sharing
    the process's write hook: a write through either is seen at once by the API's polls here."""
    writes = OrgWrites()
    app = create_app(rt, writes=writes, upload_paths=UPLOAD_PATHS)
    mount_dashboard(app, rt, writes)
    return app


def serve(settings: Settings, *, host: str, port: int, with_worker: bool = True) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _start_tracing()
    rt = open_runtime(settings)
    bootstrap(rt)
    worker = Worker(rt) if with_worker else None
    children = children_of(rt.catalog, settings.llama_server, settings.data_dir) if worker else []
    app = assemble_app(rt)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        _freeze_startup_objects()
        async with supervising(children):  # stopped after the worker, whose last calls they answer
            task = asyncio.create_task(_worker_and_deliveries(rt, worker)) if worker else None
            try:
                yield
            finally:
                if worker and task:
                    await worker.stop()
                    task.cancel()
        rt.close()
        print("openrelay: stopped" + (" (the worker handed its batches back)" if worker else ""), file=sys.stderr)

    app.router.lifespan_context = lifespan
    print(f"openrelay: serving http://{host}:{port}/v1 (data in {settings.data_dir})", file=sys.stderr)
    http = limited_http_protocol(max_header_bytes=settings.http.max_header_bytes,
                                 header_timeout=settings.http.header_timeout_seconds,
                                 body_idle_timeout=settings.http.body_idle_timeout_seconds)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, http=http)


def run_worker(settings: Settings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _start_tracing()
    rt = open_runtime(settings)
    worker = Worker(rt)
    children = children_of(rt.catalog, settings.llama_server, settings.data_dir)

    async def main() -> None:
        _freeze_startup_objects()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # SIGTERM (systemd, Kubernetes, a rolling restart) drains like ^C: claim nothing more, finish what is
            # in flight, make it durable, hand the batches back.
            loop.add_signal_handler(signum, worker.request_stop)
        try:
            async with supervising(children):
                try:
                    await _worker_and_deliveries(rt, worker)
                finally:
                    await worker.stop()
        finally:
            rt.close()

    asyncio.run(main())


async def _worker_and_deliveries(rt: Runtime, worker: Worker) -> None:
    """The worker's loop and, beside its batches, the webhook delivery loop (``webhooks/delivery.py``) and the
    sweeper (``worker/sweeper.py``), until the worker is told to stop. The delivery in flight then ends within the
    webhook timeout; an unfinished one is resent."""
    deliveries = WebhookDelivery(rt.webhook_outbox, rt.webhook_log, rt.catalog, rt.settings)
    sweeper = Sweeper(rt.retention, rt.blobs, rt.settings.retention)
    await asyncio.gather(worker.run_forever(), deliveries.run_forever(worker.stopping),
                         sweeper.run_forever(worker.stopping))


def _start_tracing() -> None:
    if tracing.configure():
        log.info("tracing: spans go to the OTLP endpoint of OTEL_EXPORTER_OTLP_* (docs/deploy.md, \"Traces\")")


def _freeze_startup_objects() -> None:
    """Move what start-up built (modules, the app, the catalog: some 100,000 objects) out of the cyclic garbage
    collector's reach. Requests make short-lived cycles, so full collections keep coming, and each would walk all
    of them again for nothing; frozen, they cost nothing."""
    gc.collect()
    gc.freeze()
