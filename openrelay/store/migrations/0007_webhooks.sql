-- Webhooks (openrelay/store/webhooks.py). An organization's endpoints; the outbox of events: one row per batch
-- that reached a terminal status, written in the transaction that wrote the status (and the operator's test
-- events, which name no batch); one delivery per event and endpoint, claimed by the workers' delivery loops; and
-- the log of every attempt, for the operator.
CREATE TABLE webhook_endpoints (
    id VARCHAR(40) PRIMARY KEY,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    url VARCHAR(2048) NOT NULL,
    secret VARCHAR(100) NOT NULL,
    created_at BIGINT NOT NULL,
    created_ns BIGINT NOT NULL,
    removed_at BIGINT
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
    PRIMARY KEY (event_id, endpoint_id)
);
CREATE INDEX ix_webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
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
