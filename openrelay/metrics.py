"""Prometheus metrics of this process, served at ``GET /metrics``. Counted where work settles, not per call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["RECORDS", "ENGINE_RETRIES", "RUNNING_BATCHES", "ENGINE_UP", "ENGINE_IN_FLIGHT", "ENGINE_CONCURRENCY_LIMIT",
           "ENGINE_LOAD", "ENGINE_KV_CACHE_USAGE", "ENGINE_LOAD_READABLE", "ENGINE_YIELDING",
           "WEBHOOK_ATTEMPTS", "OVER_REPORTS", "register_queue_depths"]

log = logging.getLogger("openrelay")

RECORDS = Counter("openrelay_records_total", "Records settled by this process's workers (made durable).",
                  ["model", "outcome"])
OVER_REPORTS = Counter("openrelay_engine_over_reports_total", "Answers whose usage reported more tokens than the "
                       "record's worst case: completion tokens past its max_tokens (or the model's default), prompt "
                       "tokens past its input bound. A batch under a hard budget is billed the worst case.",
                       ["model", "tokens"])
ENGINE_RETRIES = Counter("openrelay_engine_retries_total", "Engine calls retried after 408/429/5xx or no answer.",
                         ["model"])
RUNNING_BATCHES = Gauge("openrelay_running_batches", "Batches this process's workers are running now.", ["model"])
ENGINE_UP = Gauge("openrelay_engine_up", "1 while this process's workers send to the engine replica, 0 while it is "
                  "out of rotation for an outage.", ["model", "replica"])
ENGINE_IN_FLIGHT = Gauge("openrelay_engine_requests_in_flight", "Requests this process's workers have in flight to "
                         "the engine replica.", ["model", "replica"])
ENGINE_CONCURRENCY_LIMIT = Gauge("openrelay_engine_concurrency_limit", "Requests this process's workers send to the "
                                 "engine replica at once: the adaptive limit (concurrency = \"auto\"), else the "
                                 "replica's share of slots x concurrency.", ["model", "replica"])
# With load_metrics (worker/engine_load.py): the engine's own load as this process last read it (NaN while unknown).
ENGINE_LOAD = Gauge("openrelay_engine_load_requests", "Requests on the engine replica as its metrics last said: "
                    "running and waiting (everyone's), and ours: this process's in flight among them.",
                    ["model", "replica", "state"])
ENGINE_KV_CACHE_USAGE = Gauge("openrelay_engine_kv_cache_usage", "The engine replica's KV cache in use (0 to 1) as "
                              "its metrics last said, where they say (vLLM).", ["model", "replica"])
ENGINE_LOAD_READABLE = Gauge("openrelay_engine_load_metrics_up", "1 while the engine replica's load metrics read, 0 "
                             "while they fail: its batches then run as without load_metrics.", ["model", "replica"])
ENGINE_YIELDING = Gauge("openrelay_engine_yielding", "1 while this process's batches leave the engine replica to "
                        "others' requests (yield_to_interactive): fewer calls, or none while others wait.",
                        ["model", "replica"])
WEBHOOK_ATTEMPTS = Counter("openrelay_webhook_attempts_total", "Webhook deliveries this process's workers attempted, "
                           "by outcome: delivered (2xx), failed (another answer or none), refused (an address the "
                           "network rules refuse).", ["outcome"])


class _QueueDepths(Collector):
    """Batches queued and running per model, and each organization's share of them, read from the store at scrape
    time: the store is shared by every worker, so this is the fleet's view, not one process's."""

    def __init__(self, depths: Callable[[], dict[str, tuple[int, int]]], shares: Callable[[], list[Any]]) -> None:
        self.depths = depths
        self.shares = shares

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily("openrelay_batches_queued", "Batches waiting for a slot of their model.",
                                   labels=["model"])
        running = GaugeMetricFamily("openrelay_batches_in_progress", "Batches started and not yet finalizing, "
                                    "per model, across all workers.", labels=["model"])
        try:
            depths = self.depths()
        except Exception:  # the store is unreachable: the process's own metrics still get served
            log.exception("metrics: reading queue depths failed")
            depths = {}
        for model, (waiting, started) in sorted(depths.items()):
            queued.add_metric([model], waiting)
            running.add_metric([model], started)
        yield queued
        yield running
        yield from self._shares()

    def _shares(self) -> Iterator[Metric]:
        """Fair share (store/fair_share.py): per model and organization (its name), across all workers."""
        labels = ["model", "organization"]
        running = GaugeMetricFamily("openrelay_org_batches_running", "Batches of the model the organization has "
                                    "running now: its share of the model's slots.", labels=labels)
        queued = GaugeMetricFamily("openrelay_org_batches_queued", "Batches of the model the organization has "
                                   "waiting for a slot.", labels=labels)
        started = CounterMetricFamily("openrelay_org_batches_started", "Queued batches of the model the "
                                      "organization had started (its turns).", labels=labels)
        turn = GaugeMetricFamily("openrelay_org_last_start_timestamp_seconds", "When the organization's last "
                                 "batch of the model started (its turn: the oldest goes first among equals).",
                                 labels=labels)
        try:
            shares = self.shares()
        except Exception:
            log.exception("metrics: reading fair shares failed")
            shares = []
        for share in shares:
            values = [share.model, share.organization]
            running.add_metric(values, share.running)
            queued.add_metric(values, share.queued)
            started.add_metric(values, share.batches_started)
            if share.last_started_at is not None:
                turn.add_metric(values, share.last_started_at)
        yield from (running, queued, started, turn)


_registered: list[_QueueDepths] = []


def register_queue_depths(depths: Callable[[], dict[str, tuple[int, int]]], shares: Callable[[], list[Any]]) -> None:
    """One store per process is what ``/metrics`` reports; a later app replaces an earlier one's. ``shares``: each
    organization's share of each model (``store.fair_share.Share``)."""
    while _registered:
        REGISTRY.unregister(_registered.pop())
    _registered.append(_QueueDepths(depths, shares))
    REGISTRY.register(_registered[-1])
