-- A page of GET /v1/batches is newest first with ties broken by id: with id in the index, the database walks the
-- index backwards and stops after the page, instead of sorting every batch of the organization for each poll.
DROP INDEX ix_batches_org_order;
CREATE INDEX ix_batches_org_order ON batches (org_id, created_ns, id);
