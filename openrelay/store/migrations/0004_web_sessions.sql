-- Dashboard sign-ins (openrelay/store/sessions.py): one row per session, found by the SHA-256 of the random id
-- its cookie holds (the id itself is never stored), with the key it acts as and when it stops being valid.
CREATE TABLE web_sessions (
    id_hash VARCHAR(64) PRIMARY KEY,
    key_id VARCHAR(40) NOT NULL REFERENCES api_keys (id),
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX ix_web_sessions_expires ON web_sessions (expires_at);
