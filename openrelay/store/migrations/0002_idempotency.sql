-- Idempotency keys of creates (docs/api-contract.md §5): a claim while the first create runs, then its stored 200.
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
