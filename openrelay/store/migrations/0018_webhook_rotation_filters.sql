-- Webhooks, issue 25 (openrelay/store/webhook_endpoints.py, webhook_outbox.py): an endpoint's secret rotation
-- (the secret it replaced, which signs beside the new one for the overlap after rotated_at), the event types it
-- subscribes to (a comma-separated list; null: every type), and an id per delivery, for replays, with the time it
-- was written, for listing an endpoint's deliveries newest first. A delivery's id is made of its event's and
-- endpoint's, unique as that pair is (webhook_outbox.delivery_id); deliveries from before get theirs here, and their
-- enqueueing time.
ALTER TABLE webhook_endpoints ADD COLUMN previous_secret VARCHAR(100);
ALTER TABLE webhook_endpoints ADD COLUMN rotated_at DOUBLE PRECISION;
ALTER TABLE webhook_endpoints ADD COLUMN events VARCHAR(400);
ALTER TABLE webhook_deliveries ADD COLUMN id VARCHAR(64);
ALTER TABLE webhook_deliveries ADD COLUMN created_at DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE webhook_deliveries SET id = 'whd_' || substr(event_id, 5) || substr(endpoint_id, 4), created_at = enqueued_at;
CREATE UNIQUE INDEX ix_webhook_deliveries_id ON webhook_deliveries (id);
CREATE INDEX ix_webhook_deliveries_endpoint_time ON webhook_deliveries (endpoint_id, created_at);
-- The pruning of the delivery log (WebhookLog.prune_delivery_log) deletes attempts by age, then the deliveries and
-- events no attempt names any more.
CREATE INDEX ix_webhook_attempts_time ON webhook_attempts (attempted_at);
CREATE INDEX ix_webhook_attempts_delivery ON webhook_attempts (event_id, endpoint_id);
