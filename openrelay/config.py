"""Run-time settings of one OpenRelay process: each default and its environment variable written once, here.

``Settings`` holds the process's places (data, store, catalog, blobs) and one group per concern; ``Settings.build``
reads every group's variables from the environment (unset or empty: the default). `orl serve` and `orl worker`
show these defaults in their help and let their flags override them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["Settings", "HttpLimits", "BatchLimits", "IdempotencySettings", "ReadCaches", "WorkerSettings",
           "EngineRetries", "WebhookSettings", "RetentionSettings", "GROUPS", "env_var", "default_database_url",
           "DEFAULT_DATA_DIR", "LIVE_POLL_SECONDS"]

# How often a live view asks again: the dashboard's live regions, `orl batches wait`, `orl batches results -f`.
LIVE_POLL_SECONDS = 1.0

DEFAULT_DATA_DIR = Path(".openrelay")  # `orl serve`, `orl worker` and `orl admin` without --data-dir


def default_database_url(data_dir: Path) -> str:
    """The store when no database URL is given: SQLite in the data directory (``orl serve`` and ``orl admin``)."""
    return f"sqlite:///{data_dir.expanduser().resolve() / 'openrelay.db'}"


def _switch(raw: str) -> bool:
    return int(raw) != 0


def _count_or_none(raw: str) -> int | None:
    return int(raw) or None  # 0 is "no limit", like unset


def _positive(raw: str) -> int:
    count = int(raw)
    if count < 1:
        raise ValueError(raw)
    return count


def _days(raw: str) -> float:
    days = float(raw)
    if not days >= 0:
        raise ValueError(raw)
    return days


_PARSERS: dict[type, Callable[[str], Any]] = {bool: _switch, int: int, float: float}
_WANTED = {_switch: "a whole number (0: off)", int: "a whole number", float: "a number",
           _count_or_none: "a whole number (0: no limit)", _positive: "a whole number (1 or more)",
           _days: "a number of days (0 or more)"}


def setting(default: Any, env: str | None = None, *, parse: Callable[[str], Any] | None = None,
            repr: bool = True) -> Any:
    """A field with its default and the environment variable that overrides it (read by ``Settings.build``)."""
    metadata = {"env": env, "parse": parse or _PARSERS.get(type(default))} if env else {}
    return field(default=default, repr=repr, metadata=metadata)


def env_var(group: type, name: str) -> str:
    """The environment variable of one setting: ``env_var(HttpLimits, "max_header_bytes")``."""
    return {f.name: f for f in dataclasses.fields(group)}[name].metadata["env"]


@dataclass(frozen=True, kw_only=True)
class HttpLimits:
    """What one request may send, how slowly, and whether it is logged (the API process; `orl serve`'s flags
    override them)."""
    max_header_bytes: int = setting(65_536, "OPENRELAY_MAX_HEADER_BYTES")  # request line and headers; 431 over it
    max_create_body_bytes: int = setting(100_000_000, "OPENRELAY_MAX_CREATE_BYTES")  # the creates' bodies; 413 over
    max_json_body_bytes: int = setting(1_000_000, "OPENRELAY_MAX_JSON_BYTES")  # every other JSON route; 413 over it
    max_upload_bytes: int = setting(200_000_000, "OPENRELAY_MAX_UPLOAD_BYTES")  # a file of POST /v1/files (200 MB)
    header_timeout_seconds: float = setting(10.0, "OPENRELAY_HEADER_TIMEOUT_SECONDS")  # first byte to end of headers
    body_idle_timeout_seconds: float = setting(30.0, "OPENRELAY_BODY_TIMEOUT_SECONDS")  # a body silent this long: 408
    access_log: bool = setting(True, "OPENRELAY_ACCESS_LOG")  # a line per request: method, path, status, time, org


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    """What one batch may hold, and how long it has."""
    window_seconds: int = setting(86_400)  # the "24h" completion window (`--window-seconds`; tests shorten it)
    max_records: int = setting(50_000, "OPENRELAY_MAX_RECORDS")
    max_line_bytes: int = setting(64 * 1024 * 1024, "OPENRELAY_MAX_LINE_BYTES")  # a longer line: input unreadable


@dataclass(frozen=True, kw_only=True)
class IdempotencySettings:
    """A create's ``Idempotency-Key``."""
    keep_seconds: float = setting(86_400.0, "OPENRELAY_IDEMPOTENCY_SECONDS")  # the key and its stored 200 are kept
    claim_seconds: float = setting(300.0, "OPENRELAY_IDEMPOTENCY_CLAIM_SECONDS")  # unanswered this long: taken over


@dataclass(frozen=True, kw_only=True)
class ReadCaches:
    """What the API may reuse instead of asking the store again."""
    key_cache_seconds: float = setting(1.0, "OPENRELAY_KEY_CACHE_SECONDS")  # a key checked this long ago (max 2)
    poll_cache_seconds: float = setting(0.25, "OPENRELAY_POLL_CACHE_SECONDS")  # a poll's answer, reused (0: never)


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """A worker's claims, flushes and runs."""
    tick_seconds: float = setting(0.2, "OPENRELAY_TICK_SECONDS")  # scheduler and heartbeat period
    lease_seconds: float = setting(15.0, "OPENRELAY_LEASE_SECONDS")  # a running batch's claim; heartbeats renew it
    flush_seconds: float = setting(0.1, "OPENRELAY_FLUSH_SECONDS")  # results are made durable at least this often
    flush_records: int = setting(2000, "OPENRELAY_FLUSH_RECORDS")  # ... or when this many wait (bounds their memory)
    store_retry_max_seconds: float = setting(5.0, "OPENRELAY_STORE_RETRY_MAX_SECONDS")  # result writes, store away
    run_attempts: int = setting(8, "OPENRELAY_RUN_ATTEMPTS")  # runs failing for a reason of their own; then it fails
    run_retry_base_seconds: float = setting(2.0, "OPENRELAY_RUN_RETRY_BASE_SECONDS")  # doubles each time, capped
    run_retry_max_seconds: float = setting(300.0, "OPENRELAY_RUN_RETRY_MAX_SECONDS")
    drain_seconds: float = setting(30.0, "OPENRELAY_DRAIN_SECONDS")  # a stopping worker waits for calls in flight
    # Batches one worker process runs at once (None: as many as the slots allow); `--max-batches` overrides it.
    max_batches: int | None = setting(None, "OPENRELAY_WORKER_MAX_BATCHES", parse=_count_or_none)


@dataclass(frozen=True, kw_only=True)
class EngineRetries:
    """Calls to engines: a record's retries, probing an engine judged down, giving up on a sick one."""
    retry_attempts: int = setting(5, "OPENRELAY_RETRY_ATTEMPTS")  # attempts per record for retryable failures
    retry_base_seconds: float = setting(0.5, "OPENRELAY_RETRY_BASE_SECONDS")  # first backoff; doubles, capped
    retry_max_seconds: float = setting(8.0, "OPENRELAY_RETRY_MAX_SECONDS")
    outage_base_seconds: float = setting(1.0, "OPENRELAY_OUTAGE_BASE_SECONDS")  # first wait before a probe; doubles
    outage_max_seconds: float = setting(30.0, "OPENRELAY_OUTAGE_MAX_SECONDS")
    sick_engine_seconds: float = setting(900.0, "OPENRELAY_SICK_ENGINE_SECONDS")  # probes answered, calls failing


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    """Webhook deliveries (openrelay/webhooks): the wait after a failed attempt starts at the base and doubles,
    capped (a delivery's, and its endpoint's pause); an event is given up this long after it was written; one
    attempt may take this long, connect to last byte."""
    retry_base_seconds: float = setting(5.0, "OPENRELAY_WEBHOOK_RETRY_BASE_SECONDS")
    retry_max_seconds: float = setting(3600.0, "OPENRELAY_WEBHOOK_RETRY_MAX_SECONDS")
    give_up_seconds: float = setting(86_400.0, "OPENRELAY_WEBHOOK_GIVE_UP_SECONDS")
    timeout_seconds: float = setting(10.0, "OPENRELAY_WEBHOOK_TIMEOUT_SECONDS")
    concurrency: int = setting(128, "OPENRELAY_WEBHOOK_CONCURRENCY", parse=_positive)  # attempts a loop has in flight
    # Attempts in flight to one endpoint, across every loop; one while it is failing.
    endpoint_concurrency: int = setting(4, "OPENRELAY_WEBHOOK_ENDPOINT_CONCURRENCY", parse=_positive)
    poll_seconds: float = setting(1.0, "OPENRELAY_WEBHOOK_POLL_SECONDS")  # a worker's loop looks for due deliveries
    # After `orl admin webhook rotate`, the replaced secret signs beside the new one this long.
    rotation_overlap_seconds: float = setting(86_400.0, "OPENRELAY_WEBHOOK_ROTATION_OVERLAP_SECONDS")
    log_keep_seconds: float = setting(2_592_000.0, "OPENRELAY_WEBHOOK_LOG_KEEP_SECONDS")  # then a delivery's log goes


@dataclass(frozen=True, kw_only=True)
class RetentionSettings:
    """What is kept and for how long (docs/deploy.md, "Retention"): the floor of a file's expiry, the ended batches
    kept, and the workers' sweeper that deletes what is past them (worker/sweeper.py)."""
    min_expiry_seconds: int = setting(3600, "OPENRELAY_MIN_EXPIRY_SECONDS")  # expires_after's floor (OpenAI's: 1 h)
    # Batches ended this many days ago lose their files and rows (None: kept forever); `--retention-days`.
    retention_days: float | None = setting(None, "OPENRELAY_RETENTION_DAYS", parse=_days)
    bookkeeping_days: float = setting(7.0, "OPENRELAY_BOOKKEEPING_DAYS", parse=_days)  # chunk rows, removed endpoints
    sweep_seconds: float = setting(60.0, "OPENRELAY_SWEEP_SECONDS")  # a sweeper pass across the fleet this often
    sweep_limit: int = setting(500, "OPENRELAY_SWEEP_LIMIT")  # files, batches, rows of a kind one pass deletes


# Each group by its attribute on Settings.
GROUPS: dict[str, type] = {"http": HttpLimits, "batches": BatchLimits, "idempotency": IdempotencySettings,
                           "reads": ReadCaches, "worker": WorkerSettings, "engines": EngineRetries,
                           "webhooks": WebhookSettings, "retention": RetentionSettings}


def _from_env(group: type, environ: Mapping[str, str], **given: Any) -> Any:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(group):
        raw = environ.get(f.metadata["env"]) if f.metadata else None
        if raw:  # unset or empty: the default
            parse = f.metadata["parse"]
            try:
                values[f.name] = parse(raw)
            except ValueError:
                raise ConfigError(f"{f.metadata['env']}={raw!r} is not {_WANTED.get(parse, 'valid')}") from None
    return group(**values, **given)


@dataclass(frozen=True, kw_only=True)
class Settings:
    data_dir: Path
    database_url: str
    catalog_path: Path | None = None
    # s3://BUCKET/PREFIX, or a directory; None: data_dir/blobs (runtime.open_blob_store). The CLI reads its
    # variable (typer's envvar, shown in --help), as it does the metrics token's.
    blob_url: str | None = setting(None, "OPENRELAY_BLOB_URL")
    metrics_token: str | None = setting(None, "OPENRELAY_METRICS_TOKEN", repr=False)  # GET /metrics needs it; unlogged
    http: HttpLimits = field(default_factory=HttpLimits)
    batches: BatchLimits = field(default_factory=BatchLimits)
    idempotency: IdempotencySettings = field(default_factory=IdempotencySettings)
    reads: ReadCaches = field(default_factory=ReadCaches)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    engines: EngineRetries = field(default_factory=EngineRetries)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)

    @classmethod
    def build(cls, *, data_dir: Path, database_url: str | None, catalog_path: Path | None = None,
              window_seconds: int | None = None, metrics_token: str | None = None, blob_url: str | None = None,
              environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from the CLI's values and every group's environment variables; a variable that does not
        parse is a ``ConfigError`` naming it."""
        environ = os.environ if environ is None else environ
        data_dir = data_dir.expanduser().resolve()
        flags = {"batches": {} if window_seconds is None else {"window_seconds": window_seconds}}
        groups = {name: _from_env(group, environ, **flags.get(name, {})) for name, group in GROUPS.items()}
        return cls(
            data_dir=data_dir,
            database_url=database_url or default_database_url(data_dir),
            catalog_path=catalog_path,
            blob_url=blob_url or None,  # an empty URL (an empty env variable) is the default directory
            metrics_token=metrics_token or None,  # an empty token (an empty env variable) is none
            **groups,
        )

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"
