-- A store a year old (openrelay/store/ended_counts.py): the dashboard's summary reads counters of ENDED batches
-- instead of an aggregate over every batch. An ended batch never changes (until the retention prunes it), so its
-- counts are added in the transaction that writes its terminal status (store/results.py) and taken off in the one
-- that deletes it (store/retention.py); a metadata edit of an ended batch moves its tag rows. One row per
-- organization, tag ('' for every batch; a tag's row counts the batches carrying it), terminal status, model,
-- priority and UTC day of creation (created_at / 86400), each batch counted in its day's row and in the row of
-- every day (created_day -1), which a summary without a created range reads. The batches not yet ended are
-- bounded by what is live and aggregated directly (index ix_batches_org_status_order). The batches ended before this migration are counted
-- below; the text index of q (SQLite FTS5, PostgreSQL pg_trgm) is made by the migration's hook
-- (store/batch_text.py), since its SQL differs between the two stores.
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

INSERT INTO ended_batch_counts (org_id, tag, status, model, priority, created_day, batches, input_tokens,
                                output_tokens, cost_nano_usd)
SELECT org_id, '', status, model, priority, created_at / 86400, count(*), sum(input_tokens), sum(output_tokens),
       sum(cost_nano_usd)
FROM batches
WHERE status IN ('cancelled', 'completed', 'expired', 'failed')
GROUP BY org_id, status, model, priority, created_at / 86400;

INSERT INTO ended_batch_counts (org_id, tag, status, model, priority, created_day, batches, input_tokens,
                                output_tokens, cost_nano_usd)
SELECT b.org_id, t.tag, b.status, b.model, b.priority, b.created_at / 86400, count(*), sum(b.input_tokens),
       sum(b.output_tokens), sum(b.cost_nano_usd)
FROM batches b JOIN batch_tags t ON t.batch_id = b.id
WHERE b.status IN ('cancelled', 'completed', 'expired', 'failed')
GROUP BY b.org_id, t.tag, b.status, b.model, b.priority, b.created_at / 86400;

INSERT INTO ended_batch_counts (org_id, tag, status, model, priority, created_day, batches, input_tokens,
                                output_tokens, cost_nano_usd)
SELECT org_id, '', status, model, priority, -1, count(*), sum(input_tokens), sum(output_tokens),
       sum(cost_nano_usd)
FROM batches
WHERE status IN ('cancelled', 'completed', 'expired', 'failed')
GROUP BY org_id, status, model, priority;

INSERT INTO ended_batch_counts (org_id, tag, status, model, priority, created_day, batches, input_tokens,
                                output_tokens, cost_nano_usd)
SELECT b.org_id, t.tag, b.status, b.model, b.priority, -1, count(*), sum(b.input_tokens),
       sum(b.output_tokens), sum(b.cost_nano_usd)
FROM batches b JOIN batch_tags t ON t.batch_id = b.id
WHERE b.status IN ('cancelled', 'completed', 'expired', 'failed')
GROUP BY b.org_id, t.tag, b.status, b.model, b.priority;
