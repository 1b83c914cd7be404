-- The schema as migrations 0001 to 0021 left it, for a new store in one step (store/db.py, Database.migrate); a
-- store made before it holds versions 1 to 21 and goes on from 0022. What each table is for: store/schema.py. The
-- text index of q, whose SQL differs between the two stores, is made by this version's hook
-- (store/batch_text.py). Tests: tests/test_migrations.py.
CREATE TABLE organizations (
    id VARCHAR(40) PRIMARY KEY,
    name VARCHAR(200) NOT NULL UNIQUE,
    expedited_enabled BOOLEAN NOT NULL DEFAULT TRUE,
    created_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id VARCHAR(40) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    key_hash VARCHAR(64) NOT NULL UNIQUE,
    prefix VARCHAR(16) NOT NULL,
    scopes VARCHAR(200) NOT NULL,
    budget_nano_usd BIGINT,
    spent_nano_usd BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    hard_budget BOOLEAN NOT NULL DEFAULT FALSE,
    reserved_nano_usd BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE files (
    id VARCHAR(80) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    purpose VARCHAR(40) NOT NULL,
    filename VARCHAR(512) NOT NULL,
    bytes BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    created_ns BIGINT NOT NULL,
    blob_key VARCHAR(200) NOT NULL,
    expires_at BIGINT
);
CREATE INDEX ix_files_org_order ON files (org_id, created_ns);
CREATE INDEX ix_files_expires ON files (expires_at);

CREATE TABLE batches (
    id VARCHAR(40) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    key_id VARCHAR(40) NOT NULL REFERENCES api_keys (id),
    endpoint VARCHAR(40) NOT NULL,
    input_file_id VARCHAR(80) NOT NULL,
    input_blob_key VARCHAR(200) NOT NULL,
    completion_window VARCHAR(10) NOT NULL,
    priority VARCHAR(20) NOT NULL,
    status VARCHAR(20) NOT NULL,
    model VARCHAR(200) NOT NULL,
    created_at BIGINT NOT NULL,
    created_ns BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    in_progress_at BIGINT,
    finalizing_at BIGINT,
    completed_at BIGINT,
    failed_at BIGINT,
    expired_at BIGINT,
    cancelling_at BIGINT,
    cancelled_at BIGINT,
    output_file_id VARCHAR(80),
    error_file_id VARCHAR(80),
    errors TEXT,
    total INTEGER NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    rejected_count INTEGER NOT NULL DEFAULT 0,
    rejections_file_id VARCHAR(80),
    input_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    cost_nano_usd BIGINT NOT NULL DEFAULT 0,
    metadata TEXT,
    started BOOLEAN NOT NULL DEFAULT FALSE,
    lease_owner VARCHAR(80),
    lease_expires_at DOUBLE PRECISION,
    run_failures INTEGER NOT NULL DEFAULT 0,
    retry_at DOUBLE PRECISION,
    throughput_window TEXT,
    cached_tokens BIGINT NOT NULL DEFAULT 0,
    reasoning_tokens BIGINT NOT NULL DEFAULT 0,
    concurrency_limit INTEGER,
    output_expires_seconds INTEGER,
    reserved_nano_usd BIGINT NOT NULL DEFAULT 0,
    failure_threshold TEXT
);
CREATE INDEX ix_batches_status_model ON batches (status, model);
CREATE INDEX ix_batches_org_order ON batches (org_id, created_ns, id);
CREATE INDEX ix_batches_org_status_order ON batches (org_id, status, created_ns, id);
CREATE INDEX ix_batches_org_model_order ON batches (org_id, model, created_ns, id);
CREATE INDEX ix_batches_org_input_file ON batches (org_id, input_file_id, created_ns, id);

CREATE TABLE batch_chunks (
    batch_id VARCHAR(40) NOT NULL REFERENCES batches (id),
    seq INTEGER NOT NULL,
    out_key VARCHAR(200),
    err_key VARCHAR(200),
    lines TEXT NOT NULL,
    completed INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_nano_usd BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    out_bytes BIGINT,
    err_bytes BIGINT,
    cached_tokens BIGINT NOT NULL DEFAULT 0,
    reasoning_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, seq)
);

CREATE TABLE batch_tags (
    batch_id VARCHAR(40) NOT NULL REFERENCES batches (id),
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    tag VARCHAR(512) NOT NULL,
    created_ns BIGINT NOT NULL,
    PRIMARY KEY (batch_id, tag)
);
CREATE INDEX ix_batch_tags_org_tag_order ON batch_tags (org_id, tag, created_ns, batch_id);

CREATE TABLE ended_batch_counts (
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    tag VARCHAR(512) NOT NULL,
    status VARCHAR(20) NOT NULL,
    model VARCHAR(200) NOT NULL,
    priority VARCHAR(20) NOT NULL,
    created_day INTEGER NOT NULL,
    batches BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_nano_usd BIGINT NOT NULL,
    PRIMARY KEY (org_id, tag, status, model, priority, created_day)
);

CREATE TABLE model_locks (
    model VARCHAR(200) PRIMARY KEY
);

CREATE TABLE model_shares (
    model VARCHAR(200) NOT NULL,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    last_started_at DOUBLE PRECISION NOT NULL,
    batches_started BIGINT NOT NULL,
    PRIMARY KEY (model, org_id)
);

CREATE TABLE workers (
    id VARCHAR(200) NOT NULL PRIMARY KEY,
    host VARCHAR(255) NOT NULL,
    pid INTEGER NOT NULL,
    version VARCHAR(40) NOT NULL,
    models TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    last_seen_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE engine_limits (
    model VARCHAR(200) NOT NULL,
    replica VARCHAR(2000) NOT NULL,
    concurrency_limit INTEGER NOT NULL,
    baseline_seconds DOUBLE PRECISION NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (model, replica)
);

CREATE TABLE idempotency_keys (
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    idempotency_key VARCHAR(512) NOT NULL,
    request_sha256 VARCHAR(64) NOT NULL,
    claim_token VARCHAR(32) NOT NULL,
    claimed_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    answer TEXT,
    PRIMARY KEY (org_id, idempotency_key)
);
CREATE INDEX ix_idempotency_keys_expires ON idempotency_keys (expires_at);

CREATE TABLE web_sessions (
    id_hash VARCHAR(64) PRIMARY KEY,
    key_id VARCHAR(40) NOT NULL REFERENCES api_keys (id),
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX ix_web_sessions_expires ON web_sessions (expires_at);

CREATE TABLE sweeps (
    name VARCHAR(40) PRIMARY KEY,
    owner VARCHAR(80),
    lease_expires_at DOUBLE PRECISION,
    next_pass_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE blob_deletions (
    blob_key VARCHAR(200) PRIMARY KEY,
    folder BOOLEAN NOT NULL,
    queued_at BIGINT NOT NULL
);

CREATE TABLE webhook_endpoints (
    id VARCHAR(40) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    url VARCHAR(2048) NOT NULL,
    secret VARCHAR(100) NOT NULL,
    created_at BIGINT NOT NULL,
    created_ns BIGINT NOT NULL,
    removed_at BIGINT,
    previous_secret VARCHAR(100),
    rotated_at DOUBLE PRECISION,
    events VARCHAR(400)
);
CREATE INDEX ix_webhook_endpoints_org ON webhook_endpoints (org_id, created_ns);

CREATE TABLE webhook_events (
    id VARCHAR(40) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    type VARCHAR(40) NOT NULL,
    batch_id VARCHAR(40) REFERENCES batches (id),
    created_at BIGINT NOT NULL,
    payload TEXT NOT NULL
);
CREATE UNIQUE INDEX ix_webhook_events_batch_type ON webhook_events (batch_id, type);

CREATE TABLE webhook_deliveries (
    event_id VARCHAR(40) NOT NULL REFERENCES webhook_events (id),
    endpoint_id VARCHAR(40) NOT NULL REFERENCES webhook_endpoints (id),
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    state VARCHAR(20) NOT NULL,
    attempts INTEGER NOT NULL,
    enqueued_at DOUBLE PRECISION NOT NULL,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    claim_token VARCHAR(32),
    last_attempt_at DOUBLE PRECISION,
    delivered_at DOUBLE PRECISION,
    id VARCHAR(64),
    created_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (event_id, endpoint_id)
);
CREATE INDEX ix_webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE UNIQUE INDEX ix_webhook_deliveries_id ON webhook_deliveries (id);
CREATE INDEX ix_webhook_deliveries_endpoint_time ON webhook_deliveries (endpoint_id, created_at);

CREATE TABLE webhook_attempts (
    id VARCHAR(40) PRIMARY KEY,
    event_id VARCHAR(40) NOT NULL REFERENCES webhook_events (id),
    endpoint_id VARCHAR(40) NOT NULL REFERENCES webhook_endpoints (id),
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    attempt INTEGER NOT NULL,
    attempted_at DOUBLE PRECISION NOT NULL,
    outcome VARCHAR(20) NOT NULL,
    status_code INTEGER,
    error TEXT,
    duration_ms INTEGER NOT NULL
);
CREATE INDEX ix_webhook_attempts_org_time ON webhook_attempts (org_id, attempted_at);
CREATE INDEX ix_webhook_attempts_endpoint_time ON webhook_attempts (endpoint_id, attempted_at);
CREATE INDEX ix_webhook_attempts_time ON webhook_attempts (attempted_at);
CREATE INDEX ix_webhook_attempts_delivery ON webhook_attempts (event_id, endpoint_id);
