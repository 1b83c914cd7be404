"""Run-time settings of one OpenRelay process: each default, its environment variable and its flag written once, here,
one group per concern. A flag given wins over its variable; a value that does not parse is a ``ConfigError`` when
the process starts (docs/deploy.md). `orl` makes its flags from each setting's ``Flag`` (cli/flags.py)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["Settings", "HttpLimits", "BatchLimits", "IdempotencySettings", "ReadCaches", "WorkerSettings",
           "EngineRetries", "WebhookSettings", "RetentionSettings", "DatabasePool", "ClientSettings", "GROUPS",
           "Flag", "FLAGS", "default_database_url", "DEFAULT_DATA_DIR", "LIVE_POLL_SECONDS"]

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


_PARSERS: dict[type, Callable[[str], Any]] = {bool: _switch, int: int, float: float}
_WANTED = {_switch: "a whole number (0: off)", int: "a whole number", float: "a number",
           _count_or_none: "a whole number (0: no limit)"}


@dataclass(frozen=True)
class Flag:
    """A setting taken as a flag too: its help, its name where not the field's, and the default None in words."""
    help: str
    name: str = ""
    unset: str = ""


def setting(default: Any, env: str | None = None, *, parse: Callable[[str], Any] | None = None,
            least: float | None = None, flag: Flag | None = None, repr: bool = True) -> Any:
    """A field with its default, the environment variable that overrides it and the flag that overrides both; a
    value below ``least`` is refused, from the variable and from the flag alike."""
    metadata = {"env": env, "parse": parse or _PARSERS.get(type(default), str), "least": least, "flag": flag}
    return field(default=default, repr=repr, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class HttpLimits:
    """What one request may send, how slowly, and whether it is logged (the API process; `orl serve`'s flags
    override them)."""
    max_header_bytes: int = setting(65_536, "OPENRELAY_MAX_HEADER_BYTES", least=1, flag=Flag(
        "Request line and headers together, in bytes; over it: 431"))
    max_create_body_bytes: int = setting(100_000_000, "OPENRELAY_MAX_CREATE_BYTES", least=1, flag=Flag(
        "Body of POST /v1/batches (inline records) and POST /v1/messages/batches, in bytes; over it: 413",
        name="max_create_bytes"))
    max_json_body_bytes: int = setting(1_000_000, "OPENRELAY_MAX_JSON_BYTES", least=1, flag=Flag(
        "Body of every other JSON route, in bytes; over it: 413", name="max_json_bytes"))
    max_upload_bytes: int = setting(200_000_000, "OPENRELAY_MAX_UPLOAD_BYTES", least=1, flag=Flag(
        "File of POST /v1/files, in bytes; over it: 413 file_too_large"))
    header_timeout_seconds: float = setting(10.0, "OPENRELAY_HEADER_TIMEOUT_SECONDS", least=0.001, flag=Flag(
        "Seconds from a request's first byte to the end of its headers; over it: 408", name="header_timeout"))
    body_idle_timeout_seconds: float = setting(30.0, "OPENRELAY_BODY_TIMEOUT_SECONDS", least=0.001, flag=Flag(
        "Seconds a body being read may send nothing; over it: 408", name="body_timeout"))
    access_log: bool = setting(True, "OPENRELAY_ACCESS_LOG", flag=Flag(
        "A log line per request: method, path, status, time, organization; never a key, a query or a body"))


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    """What one batch may hold, and how long it has."""
    window_seconds: int = setting(86_400, flag=Flag("Seconds in the 24h completion window (tests shorten it)."))
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
    poll_cache_seconds: float = setting(0.25, "OPENRELAY_POLL_CACHE_SECONDS", least=0)  # a poll's answer kept; 0: never


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
    max_batches: int | None = setting(None, "OPENRELAY_WORKER_MAX_BATCHES", parse=_count_or_none, least=1,
        flag=Flag("Batches this process's worker runs at once, so that a fleet of workers shares the catalog's slots",
                  unset="as many as the slots allow"))


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
    concurrency: int = setting(128, "OPENRELAY_WEBHOOK_CONCURRENCY", least=1)  # attempts a loop has in flight
    # Attempts in flight to one endpoint, across every loop; one while it is failing.
    endpoint_concurrency: int = setting(4, "OPENRELAY_WEBHOOK_ENDPOINT_CONCURRENCY", least=1)
    poll_seconds: float = setting(1.0, "OPENRELAY_WEBHOOK_POLL_SECONDS")  # a worker's loop looks for due deliveries
    # After `orl admin webhook rotate`, the replaced secret signs beside the new one this long.
    rotation_overlap_seconds: float = setting(86_400.0, "OPENRELAY_WEBHOOK_ROTATION_OVERLAP_SECONDS")
    log_keep_seconds: float = setting(2_592_000.0, "OPENRELAY_WEBHOOK_LOG_KEEP_SECONDS")  # then a delivery's log goes


@dataclass(frozen=True, kw_only=True)
class RetentionSettings:
    """What is kept and for how long (docs/deploy.md, "Retention"): the floor of a file's expiry, the ended batches
    kept, and the workers' sweeper that deletes what is past them (worker/sweeper.py)."""
    min_expiry_seconds: int = setting(3600, "OPENRELAY_MIN_EXPIRY_SECONDS", least=1, flag=Flag(  # OpenAI's: 1 h
        "The least expires_after / output_expires_after seconds taken"))
    retention_days: float | None = setting(None, "OPENRELAY_RETENTION_DAYS", parse=float, least=0, flag=Flag(
        "Batches that ended more than this many days ago lose their files (bytes included) and rows; fractions "
        "allowed", unset="kept forever"))
    bookkeeping_days: float = setting(7.0, "OPENRELAY_BOOKKEEPING_DAYS", least=0)  # chunk rows, removed endpoints
    sweep_seconds: float = setting(60.0, "OPENRELAY_SWEEP_SECONDS")  # a sweeper pass across the fleet this often
    sweep_limit: int = setting(500, "OPENRELAY_SWEEP_LIMIT")  # files, batches, rows of a kind one pass deletes


@dataclass(frozen=True, kw_only=True)
class DatabasePool:
    """Connections one process keeps to the store (SQLAlchemy's pool): this many, and this many more at a peak."""
    size: int = setting(8, "OPENRELAY_DB_POOL_SIZE", least=1)
    overflow: int = setting(8, "OPENRELAY_DB_MAX_OVERFLOW")
    connect_seconds: int = setting(2, "OPENRELAY_DB_CONNECT_SECONDS", least=1)  # PostgreSQL away past it: 503


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """The users' `orl` commands (cli/http.py): which API they talk to, with which key."""
    base_url: str = setting("http://127.0.0.1:8080/v1", "OPENRELAY_BASE_URL")
    api_key: str | None = setting(None, "OPENRELAY_API_KEY", repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        return cls(**_read(cls, os.environ if environ is None else environ, {}))


# Each group by its attribute on Settings.
GROUPS: dict[str, type] = {"http": HttpLimits, "batches": BatchLimits, "idempotency": IdempotencySettings,
                           "reads": ReadCaches, "worker": WorkerSettings, "engines": EngineRetries,
                           "webhooks": WebhookSettings, "retention": RetentionSettings, "database": DatabasePool}


def _read(group: type, environ: Mapping[str, str], flags: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``group`` that a flag or a variable gives, by field; a flag given wins."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(group):
        if not f.metadata:
            continue  # a place or a group of Settings, not a setting
        env, parse, least, flag = (f.metadata[key] for key in ("env", "parse", "least", "flag"))
        given = flags.get(flag.name or f.name) if flag else None
        raw = environ.get(env) if env else None
        if given not in (None, ""):
            values[f.name] = given
        elif raw:  # unset or empty: the default
            try:
                values[f.name] = parse(raw)
            except ValueError:
                raise ConfigError(f"{env}={raw!r} is not {_WANTED.get(parse, 'valid')}") from None
            if least is not None and values[f.name] is not None and not values[f.name] >= least:
                raise ConfigError(f"{env}={raw!r} is less than {least:g}")
    return values


@dataclass(frozen=True, kw_only=True)
class Settings:
    data_dir: Path
    database_url: str
    catalog_path: Path | None = None
    blob_url: str | None = setting(None, "OPENRELAY_BLOB_URL", flag=Flag(
        "s3://BUCKET/PREFIX (endpoint, region and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY) or a directory", unset="the data dir's blobs/"))  # runtime.open_blob_store
    metrics_token: str | None = setting(None, "OPENRELAY_METRICS_TOKEN", repr=False, flag=Flag(  # never logged
        "GET /metrics then needs 'Authorization: Bearer TOKEN'", unset="open"))
    # The llama-server program that runs each llama-cpp model (engines/llama_child.py); scripts/setup.sh builds it.
    llama_server: str = setting("~/.cache/openrelay/llama-server-0.3.36/llama-server", "OPENRELAY_LLAMA_SERVER")
    http: HttpLimits = field(default_factory=HttpLimits)
    batches: BatchLimits = field(default_factory=BatchLimits)
    idempotency: IdempotencySettings = field(default_factory=IdempotencySettings)
    reads: ReadCaches = field(default_factory=ReadCaches)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    engines: EngineRetries = field(default_factory=EngineRetries)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    database: DatabasePool = field(default_factory=DatabasePool)

    @classmethod
    def build(cls, *, data_dir: Path, database_url: str | None, catalog_path: Path | None = None,
              environ: Mapping[str, str] | None = None, **flags: Any) -> Settings:
        """Settings from the places and flags a command was given (a flag by its name in ``FLAGS``; None: not
        given) and every variable of the environment."""
        if unknown := set(flags) - set(FLAGS):
            raise TypeError(f"no such flag: {', '.join(sorted(unknown))}")
        environ = os.environ if environ is None else environ
        data_dir = data_dir.expanduser().resolve()
        groups = {name: group(**_read(group, environ, flags)) for name, group in GROUPS.items()}
        return cls(data_dir=data_dir, database_url=database_url or default_database_url(data_dir),
                   catalog_path=catalog_path, **_read(cls, environ, flags), **groups)

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"


# Each flag by its name: the class that holds its setting, and the setting's field.
FLAGS: dict[str, tuple[type, dataclasses.Field[Any]]] = {
    (f.metadata["flag"].name or f.name): (group, f) for group in (Settings, *GROUPS.values())
    for f in dataclasses.fields(group) if f.metadata.get("flag")}
