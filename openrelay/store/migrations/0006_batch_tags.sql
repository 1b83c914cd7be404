-- Tags as rows (openrelay/store/tags.py), so a list filtered by a tag reads an index instead of a LIKE over the
-- metadata text of every batch of the organization. The rows of existing batches are written by the Python
-- backfill that store/db.py runs right after this file, in the same transaction: splitting a comma-separated
-- list and trimming it as types.tag_list does has no portable SQL.
CREATE TABLE batch_tags (
    batch_id VARCHAR(40) NOT NULL REFERENCES batches (id),
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    tag VARCHAR(512) NOT NULL,
    created_ns BIGINT NOT NULL,
    PRIMARY KEY (batch_id, tag)
);
CREATE INDEX ix_batch_tags_org_tag_order ON batch_tags (org_id, tag, created_ns, batch_id);
-- The lists filtered by status or by model, newest first: ix_batches_status_model (the workers' claims) has no
-- organization, so such a page walked the organization's every batch.
CREATE INDEX ix_batches_org_status_order ON batches (org_id, status, created_ns, id);
CREATE INDEX ix_batches_org_model_order ON batches (org_id, model, created_ns, id);
