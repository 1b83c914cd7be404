-- The first schema: organizations, keys, files, batches and the durable chunks of running batches.
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
    revoked_at BIGINT
);

CREATE TABLE files (
    id VARCHAR(80) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    purpose VARCHAR(40) NOT NULL,
    filename VARCHAR(512) NOT NULL,
    bytes BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    created_ns BIGINT NOT NULL,
    blob_key VARCHAR(200) NOT NULL
);
CREATE INDEX ix_files_org_order ON files (org_id, created_ns);

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
    lease_expires_at DOUBLE PRECISION
);
CREATE INDEX ix_batches_org_order ON batches (org_id, created_ns);
CREATE INDEX ix_batches_status_model ON batches (status, model);

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
    PRIMARY KEY (batch_id, seq)
);

CREATE TABLE model_locks (
    model VARCHAR(200) PRIMARY KEY
);
