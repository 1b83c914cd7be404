"""Run-time settings of one OpenRelay process, from CLI flags (and a few environment overrides for tests)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Settings", "default_database_url", "LIVE_POLL_SECONDS"]

# How often a live view asks again: the dashboard's live regions, `orl batches wait`, `orl batches results -f`.
LIVE_POLL_SECONDS = 1.0


def default_database_url(data_dir: Path) -> str:
    """The store when no database URL is given: SQLite in the data directory (``orl serve`` and ``orl admin``)."""
    return f"sqlite:///{data_dir.expanduser().resolve() / 'openrelay.db'}"


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


@dataclass(frozen=True, kw_only=True)
class Settings:
    data_dir: Path
    database_url: str
    catalog_path: Path | None = None
    blob_url: str | None = None  # s3://BUCKET/PREFIX, or a directory; None: data_dir/blobs (runtime.open_blob_store)
    window_seconds: int = 86_400  # length of the "24h" completion window
    max_upload_bytes: int = 200_000_000  # 200 MB
    max_header_bytes: int = 65_536  # a request line and headers, together (431 over it)
    max_create_body_bytes: int = 100_000_000  # the JSON body of POST /v1/batches (inline records); 413 over it
    max_json_body_bytes: int = 1_000_000  # the JSON body of every other route but uploads; 413 over it
    header_timeout_seconds: float = 10.0  # a request line and headers must be in this long after the first byte
    body_idle_timeout_seconds: float = 30.0  # a body awaited with no byte for this long is refused (408)
    max_records: int = 50_000
    max_line_bytes: int = 64 * 1024 * 1024  # a longer line makes the input unreadable
    lease_seconds: float = 15.0  # a running batch's claim; renewed by its worker's heartbeat
    tick_seconds: float = 0.2  # scheduler and heartbeat period
    flush_seconds: float = 0.1  # results are made durable at least this often while a batch runs
    flush_records: int = 2000  # ... or when this many are waiting (bounds the memory they hold)
    retry_attempts: int = 5  # engine attempts per record for retryable failures
    retry_base_seconds: float = 0.5  # first backoff; doubles each retry, capped below
    retry_max_seconds: float = 8.0
    idempotency_seconds: float = 86_400.0  # how long a create's Idempotency-Key and its stored 200 are kept
    idempotency_claim_seconds: float = 300.0  # a claim this old with no answer is a dead create's: take it over
    outage_base_seconds: float = 1.0  # first wait before probing an engine judged down; doubles, capped below
    outage_max_seconds: float = 30.0
    sick_engine_seconds: float = 900.0  # how long a record waits for an engine that answers probes but fails calls
    key_cache_seconds: float = 1.0  # reads may use a key checked this long ago (at most 2: revokes must bite)
    poll_cache: bool = True  # polls may reuse rows the store says are unchanged (store/read_cache.py)
    store_retry_max_seconds: float = 5.0  # longest wait between tries of a result write while the store is away
    run_attempts: int = 8  # runs of a batch that fail for a reason of their own before the batch fails
    run_retry_base_seconds: float = 2.0  # wait after the first failed run; doubles each time, capped below
    run_retry_max_seconds: float = 300.0
    drain_seconds: float = 30.0  # a stopping worker waits this long for its calls in flight before cancelling them
    # Webhook deliveries (openrelay/webhooks): the wait after a failed attempt starts at the base and doubles,
    # capped; an event is given up this long after it was written; one attempt may take this long.
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_max_seconds: float = 3600.0
    webhook_give_up_seconds: float = 86_400.0
    webhook_timeout_seconds: float = 10.0
    webhook_poll_seconds: float = 1.0  # how often a worker's delivery loop looks for due deliveries
    max_batches: int | None = None  # batches one worker process runs at once (None: as many as the slots allow)
    metrics_token: str | None = field(default=None, repr=False)  # GET /metrics needs it when set (not logged)

    @classmethod
    def build(cls, *, data_dir: Path, database_url: str | None, catalog_path: Path | None = None,
              window_seconds: int = 86_400, metrics_token: str | None = None,
              blob_url: str | None = None) -> Settings:
        data_dir = data_dir.expanduser().resolve()
        url = database_url or default_database_url(data_dir)
        return cls(
            data_dir=data_dir,
            database_url=url,
            catalog_path=catalog_path,
            blob_url=blob_url or None,  # an empty URL (an empty env variable) is the default directory
            window_seconds=window_seconds,
            metrics_token=metrics_token or None,  # an empty token (an empty env variable) is none
            # Limits and timings below are overridable from the environment so tests can shrink them.
            max_upload_bytes=_env_int("OPENRELAY_MAX_UPLOAD_BYTES", 200_000_000),
            max_header_bytes=_env_int("OPENRELAY_MAX_HEADER_BYTES", 65_536),
            max_create_body_bytes=_env_int("OPENRELAY_MAX_CREATE_BYTES", 100_000_000),
            max_json_body_bytes=_env_int("OPENRELAY_MAX_JSON_BYTES", 1_000_000),
            header_timeout_seconds=_env_float("OPENRELAY_HEADER_TIMEOUT_SECONDS", 10.0),
            body_idle_timeout_seconds=_env_float("OPENRELAY_BODY_TIMEOUT_SECONDS", 30.0),
            max_records=_env_int("OPENRELAY_MAX_RECORDS", 50_000),
            max_line_bytes=_env_int("OPENRELAY_MAX_LINE_BYTES", 64 * 1024 * 1024),
            flush_seconds=_env_float("OPENRELAY_FLUSH_SECONDS", 0.1),
            flush_records=_env_int("OPENRELAY_FLUSH_RECORDS", 2000),
            lease_seconds=_env_float("OPENRELAY_LEASE_SECONDS", 15.0),
            tick_seconds=_env_float("OPENRELAY_TICK_SECONDS", 0.2),
            retry_attempts=_env_int("OPENRELAY_RETRY_ATTEMPTS", 5),
            retry_base_seconds=_env_float("OPENRELAY_RETRY_BASE_SECONDS", 0.5),
            retry_max_seconds=_env_float("OPENRELAY_RETRY_MAX_SECONDS", 8.0),
            idempotency_seconds=_env_float("OPENRELAY_IDEMPOTENCY_SECONDS", 86_400.0),
            idempotency_claim_seconds=_env_float("OPENRELAY_IDEMPOTENCY_CLAIM_SECONDS", 300.0),
            outage_base_seconds=_env_float("OPENRELAY_OUTAGE_BASE_SECONDS", 1.0),
            outage_max_seconds=_env_float("OPENRELAY_OUTAGE_MAX_SECONDS", 30.0),
            sick_engine_seconds=_env_float("OPENRELAY_SICK_ENGINE_SECONDS", 900.0),
            key_cache_seconds=_env_float("OPENRELAY_KEY_CACHE_SECONDS", 1.0),
            poll_cache=_env_int("OPENRELAY_POLL_CACHE", 1) != 0,
            store_retry_max_seconds=_env_float("OPENRELAY_STORE_RETRY_MAX_SECONDS", 5.0),
            run_attempts=_env_int("OPENRELAY_RUN_ATTEMPTS", 8),
            run_retry_base_seconds=_env_float("OPENRELAY_RUN_RETRY_BASE_SECONDS", 2.0),
            run_retry_max_seconds=_env_float("OPENRELAY_RUN_RETRY_MAX_SECONDS", 300.0),
            drain_seconds=_env_float("OPENRELAY_DRAIN_SECONDS", 30.0),
            webhook_retry_base_seconds=_env_float("OPENRELAY_WEBHOOK_RETRY_BASE_SECONDS", 5.0),
            webhook_retry_max_seconds=_env_float("OPENRELAY_WEBHOOK_RETRY_MAX_SECONDS", 3600.0),
            webhook_give_up_seconds=_env_float("OPENRELAY_WEBHOOK_GIVE_UP_SECONDS", 86_400.0),
            webhook_timeout_seconds=_env_float("OPENRELAY_WEBHOOK_TIMEOUT_SECONDS", 10.0),
            webhook_poll_seconds=_env_float("OPENRELAY_WEBHOOK_POLL_SECONDS", 1.0),
            max_batches=_env_int("OPENRELAY_WORKER_MAX_BATCHES", 0) or None,
        )

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"
