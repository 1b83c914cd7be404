"""Prometheus metrics of this process, served at ``GET /metrics``. Counted where work settles, not per call."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = ["RECORDS", "ENGINE_RETRIES", "RUNNING_BATCHES"]

RECORDS = Counter("openrelay_records_total", "Records settled by this process's workers (made durable).",
                  ["model", "outcome"])
ENGINE_RETRIES = Counter("openrelay_engine_retries_total", "Engine calls retried after 408/429/5xx or no answer.",
                         ["model"])
RUNNING_BATCHES = Gauge("openrelay_running_batches", "Batches this process's workers are running now.", ["model"])
