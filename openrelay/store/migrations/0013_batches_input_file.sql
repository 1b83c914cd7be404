-- Which batches were made from a file (input_file_id): the dashboard's Files page and New batch picker show them
-- for every file of a page, in one query (store/files.py, Files.batches_reading) answered from this index
-- instead of a walk over every batch of the organization.
CREATE INDEX ix_batches_org_input_file ON batches (org_id, input_file_id, created_ns, id);
