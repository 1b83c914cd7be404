-- Webhooks, issue 34 (openrelay/store/webhook_outbox.py): each endpoint's circuit, the attempts to it that failed
-- in a row and the time before which no attempt is made to it, and an index of each endpoint's pending deliveries,
-- which its pause moves.
ALTER TABLE webhook_endpoints ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE webhook_endpoints ADD COLUMN paused_until DOUBLE PRECISION;
CREATE INDEX ix_webhook_deliveries_endpoint_pending ON webhook_deliveries (endpoint_id, next_attempt_at)
    WHERE state = 'pending';
