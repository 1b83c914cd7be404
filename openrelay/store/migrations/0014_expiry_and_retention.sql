-- File expiry and retention (issue 23 parts 2 and 3; openrelay/store/retention.py, openrelay/worker/sweeper.py).
-- A file's expires_at (null: kept until deleted): from then on every route answers 404 and the sweeper deletes it.
ALTER TABLE files ADD COLUMN expires_at BIGINT;
CREATE INDEX ix_files_expires ON files (expires_at);
-- A create's output_expires_after.seconds: the output and error files expire this long after they are made.
ALTER TABLE batches ADD COLUMN output_expires_seconds INTEGER;
-- The sweeper's lease: one pass at a time across the fleet, by the database's clock, and when the next is due.
CREATE TABLE sweeps (
    name VARCHAR(40) PRIMARY KEY,
    owner VARCHAR(80),
    lease_expires_at DOUBLE PRECISION,
    next_pass_at DOUBLE PRECISION NOT NULL
);
-- Blobs whose rows are gone, queued in the transaction that deleted the rows, deleted by the next pass: a sweeper
-- killed between the two leaves the bytes queued, never orphaned.
CREATE TABLE blob_deletions (
    blob_key VARCHAR(200) PRIMARY KEY,
    folder BOOLEAN NOT NULL,
    queued_at BIGINT NOT NULL
);
