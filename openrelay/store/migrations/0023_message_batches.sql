-- Anthropic's Message Batches (openrelay/service/message_batches.py): how many records of an ended batch never
-- started (its canceled or expired results), and the organization's batches of one endpoint, newest first, for
-- GET /v1/messages/batches.
ALTER TABLE batches ADD COLUMN unrun INTEGER NOT NULL DEFAULT 0;
CREATE INDEX ix_batches_org_endpoint_order ON batches (org_id, endpoint, created_ns, id);
