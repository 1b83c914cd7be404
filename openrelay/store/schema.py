"""Every table of the store, as SQLAlchemy Core. The baseline and the migrations after it (``store/migrations/*.sql``,
applied by ``store/db.py``) create exactly these tables and columns, and the indexes, which only they define;
``tests/unit/test_migrations.py`` proves the two agree. What a table is for is told by the module named above it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

__all__ = ["metadata", "organizations", "api_keys", "files", "batches", "batch_chunks", "model_locks", "model_shares",
           "engine_limits", "idempotency_keys", "web_sessions", "batch_tags", "workers", "webhook_endpoints",
           "webhook_events", "webhook_deliveries", "webhook_attempts", "sweeps", "blob_deletions", "ended_batch_counts"]

metadata = MetaData()

organizations = Table(
    "organizations", metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("expedited_enabled", Boolean, nullable=False, default=True),
    Column("created_at", BigInteger, nullable=False),
)

api_keys = Table(
    "api_keys", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),  # sha256 hex of the secret
    Column("prefix", String(16), nullable=False),  # first characters, to recognise a key in listings
    Column("scopes", String(200), nullable=False),  # comma-separated
    Column("budget_nano_usd", BigInteger, nullable=True),
    Column("spent_nano_usd", BigInteger, nullable=False, default=0),
    Column("hard_budget", Boolean, nullable=False, default=False),  # creates reserve their maximum cost (0016)
    Column("reserved_nano_usd", BigInteger, nullable=False, default=0),  # what its running batches still hold
    Column("created_at", BigInteger, nullable=False),
    Column("revoked_at", BigInteger, nullable=True),
)

files = Table(
    "files", metadata,
    Column("id", String(80), primary_key=True),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("purpose", String(40), nullable=False),
    Column("filename", String(512), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("created_ns", BigInteger, nullable=False),  # ordering; created_at has only second precision
    Column("blob_key", String(200), nullable=False),
    Column("expires_at", BigInteger),  # 404 from then on, and the sweeper deletes it (migration 0014); null: kept
)

batches = Table(
    "batches", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("key_id", String(40), ForeignKey("api_keys.id"), nullable=False),
    Column("endpoint", String(40), nullable=False),
    Column("input_file_id", String(80), nullable=False),
    Column("input_blob_key", String(200), nullable=False),
    Column("completion_window", String(10), nullable=False),
    Column("priority", String(20), nullable=False),
    Column("status", String(20), nullable=False),
    Column("model", String(200), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("in_progress_at", BigInteger),
    Column("finalizing_at", BigInteger),
    Column("completed_at", BigInteger),
    Column("failed_at", BigInteger),
    Column("expired_at", BigInteger),
    Column("cancelling_at", BigInteger),
    Column("cancelled_at", BigInteger),
    Column("output_file_id", String(80)),
    Column("error_file_id", String(80)),
    Column("errors", Text),  # JSON list or null
    Column("total", Integer, nullable=False),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("rejected_count", Integer, nullable=False, default=0),
    Column("rejections_file_id", String(80)),
    Column("input_tokens", BigInteger, nullable=False, default=0),
    Column("cached_tokens", BigInteger, nullable=False, default=0),  # of input_tokens (migration 0011)
    Column("output_tokens", BigInteger, nullable=False, default=0),
    Column("reasoning_tokens", BigInteger, nullable=False, default=0),  # of output_tokens
    Column("cost_nano_usd", BigInteger, nullable=False, default=0),
    Column("metadata", Text),  # JSON object or null
    Column("failure_threshold", Text),  # the early abort's rule, JSON {error_rate, min_records} or null (0017)
    Column("started", Boolean, nullable=False, default=False),  # claimed into a slot at least once
    Column("lease_owner", String(80)),  # the worker running it now
    Column("lease_expires_at", Float),
    Column("run_failures", Integer, nullable=False, default=0),  # runs that failed for a reason of their own
    Column("retry_at", Float),  # a failed run's batch waits until then before a worker takes it again
    Column("throughput_window", Text),  # the last minute's flushes, per second (store/throughput.py); JSON or null
    Column("concurrency_limit", Integer),  # the adaptive limit its worker runs it at now; null when unknown
    Column("yielding", Boolean, nullable=False, default=False),  # its worker leaves the engine to others (0024)
    Column("reserved_nano_usd", BigInteger, nullable=False, default=0),  # of its key's hard budget (0016)
    Column("output_expires_seconds", Integer),  # output_expires_after.seconds: its result files' expiry (0014)
    Column("unrun", Integer, nullable=False, default=0),  # records an ended batch never started (0023)
)

# One row per tag of a batch (store/tags.py); ``created_ns`` is the batch's, so that its index alone gives the order.
batch_tags = Table(
    "batch_tags", metadata,
    Column("batch_id", String(40), ForeignKey("batches.id"), nullable=False),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("tag", String(512), nullable=False),  # a metadata value holds at most 512 characters
    Column("created_ns", BigInteger, nullable=False),
    PrimaryKeyConstraint("batch_id", "tag"),
)

# One row per durable flush of a running batch (store/results.py): its result blobs and what they added up to.
batch_chunks = Table(
    "batch_chunks", metadata,
    Column("batch_id", String(40), ForeignKey("batches.id"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("out_key", String(200)),
    Column("err_key", String(200)),
    Column("lines", Text, nullable=False),  # JSON list of input line numbers settled by this chunk
    Column("completed", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost_nano_usd", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("out_bytes", BigInteger),  # the out blob's size (migration 0009; null for chunks written before it)
    Column("err_bytes", BigInteger),  # the err blob's size
    Column("cached_tokens", BigInteger, nullable=False, default=0),  # of input_tokens (migration 0011)
    Column("reasoning_tokens", BigInteger, nullable=False, default=0),  # of output_tokens
    PrimaryKeyConstraint("batch_id", "seq"),
)

# A row per model, locked while a worker claims a batch of that model (store/db.py, on PostgreSQL).
model_locks = Table(
    "model_locks", metadata,
    Column("model", String(200), primary_key=True),
)

# Each organization's turn at each model's slots (store/fair_share.py).
model_shares = Table(
    "model_shares", metadata,
    Column("model", String(200), nullable=False),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("last_started_at", Float, nullable=False),
    Column("batches_started", BigInteger, nullable=False),
    PrimaryKeyConstraint("model", "org_id"),
)

# What each engine replica's adaptive concurrency limiter learnt, per model (store/engine_limits.py).
engine_limits = Table(
    "engine_limits", metadata,
    Column("model", String(200), nullable=False),
    Column("replica", String(2000), nullable=False),
    Column("concurrency_limit", Integer, nullable=False),
    Column("baseline_seconds", Float, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("model", "replica"),
)

# One row per organization and Idempotency-Key of a create (store/idempotency.py).
idempotency_keys = Table(
    "idempotency_keys", metadata,
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("idempotency_key", String(512), nullable=False),  # as sent: 1 to 512 bytes, one character per byte
    Column("request_sha256", String(64), nullable=False),  # hex digest of the request body's exact bytes
    Column("claim_token", String(32), nullable=False),  # which create holds the claim; a takeover changes it
    Column("claimed_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("answer", Text),  # the 200's body, replayed byte for byte; null while the create runs
    PrimaryKeyConstraint("org_id", "idempotency_key"),
)

# Dashboard sign-ins (store/sessions.py).
web_sessions = Table(
    "web_sessions", metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("key_id", String(40), ForeignKey("api_keys.id"), nullable=False),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
)

# An organization's webhook endpoints (store/webhook_endpoints.py). A removed one keeps its row for the delivery log.
webhook_endpoints = Table(
    "webhook_endpoints", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("url", String(2048), nullable=False),  # normalized (openrelay.urls): what is connected to
    Column("secret", String(100), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("removed_at", BigInteger),
    Column("previous_secret", String(100)),  # what the last rotation replaced: it signs too until the overlap ends
    Column("rotated_at", Float),
    Column("events", String(400)),  # the event types it gets, comma-separated (null: every type)
    Column("failures", Integer, nullable=False, default=0),  # its circuit: attempts failed in a row ...
    Column("paused_until", Float),  # ... and no attempt to it before then
)

# The outbox (store/webhook_outbox.py): an event per batch ended, and the deliveries of each to each endpoint.
webhook_events = Table(
    "webhook_events", metadata,
    Column("id", String(40), primary_key=True),  # evt_ + hex: the webhook-id header, the same on every attempt
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("type", String(40), nullable=False),
    Column("batch_id", String(40), ForeignKey("batches.id")),
    Column("created_at", BigInteger, nullable=False),
    Column("payload", Text, nullable=False),  # the body sent, byte for byte, on every attempt
)

webhook_deliveries = Table(
    "webhook_deliveries", metadata,
    Column("event_id", String(40), ForeignKey("webhook_events.id"), nullable=False),
    Column("endpoint_id", String(40), ForeignKey("webhook_endpoints.id"), nullable=False),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("state", String(20), nullable=False),  # pending | delivered | failed (gave up) | removed (endpoint)
    Column("attempts", Integer, nullable=False),
    Column("enqueued_at", Float, nullable=False),
    Column("next_attempt_at", Float, nullable=False),
    Column("claim_token", String(32)),  # the claim of the loop attempting it now; its result is fenced by it
    Column("last_attempt_at", Float),
    Column("delivered_at", Float),
    Column("id", String(64)),  # whd_ + the event's and endpoint's hex (0018): what a replay names; always set
    Column("created_at", Float, nullable=False),  # when it was written (a replay keeps it); migration 0018
    PrimaryKeyConstraint("event_id", "endpoint_id"),
)

# The delivery log (store/webhook_log.py): every attempt, its answer or why there was none.
webhook_attempts = Table(
    "webhook_attempts", metadata,
    Column("id", String(40), primary_key=True),
    Column("event_id", String(40), ForeignKey("webhook_events.id"), nullable=False),
    Column("endpoint_id", String(40), ForeignKey("webhook_endpoints.id"), nullable=False),
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("attempt", Integer, nullable=False),  # 1 for the first
    Column("attempted_at", Float, nullable=False),
    Column("outcome", String(20), nullable=False),  # delivered | failed | refused (network safety)
    Column("status_code", Integer),
    Column("error", Text),
    Column("duration_ms", Integer, nullable=False),
)

# The sweeper's lease and the blobs it still has to delete (store/retention.py).
sweeps = Table(
    "sweeps", metadata,
    Column("name", String(40), primary_key=True),
    Column("owner", String(80)),  # the worker running a pass now; null between passes
    Column("lease_expires_at", Float),
    Column("next_pass_at", Float, nullable=False),
)

blob_deletions = Table(
    "blob_deletions", metadata,
    Column("blob_key", String(200), primary_key=True),
    Column("folder", Boolean, nullable=False),  # everything under the key (a batch's folder)
    Column("queued_at", BigInteger, nullable=False),
)

# The live worker processes (store/workers.py).
workers = Table(
    "workers", metadata,
    Column("id", String(200), primary_key=True),  # the worker id its batch leases carry (lease_owner)
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(40), nullable=False),
    Column("models", Text, nullable=False),  # the models its catalog serves, one per line
    Column("started_at", Float, nullable=False),
    Column("last_seen_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)

# Counters of ended batches (store/ended_counts.py). SQLite also has ``batch_text``, the FTS5 index of q
# (store/batch_text.py): a virtual table, not declared here.
ended_batch_counts = Table(
    "ended_batch_counts", metadata,
    Column("org_id", String(40), ForeignKey("organizations.id"), nullable=False),
    Column("tag", String(512), nullable=False),
    Column("status", String(20), nullable=False),
    Column("model", String(200), nullable=False),
    Column("priority", String(20), nullable=False),
    Column("created_day", Integer, nullable=False),
    Column("batches", BigInteger, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost_nano_usd", BigInteger, nullable=False),
    PrimaryKeyConstraint("org_id", "tag", "status", "model", "priority", "created_day"),
)
