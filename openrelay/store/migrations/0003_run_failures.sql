-- A batch run that fails for a reason of its own (not one record's) is retried with backoff, then the batch fails:
-- how many runs failed so far, and the earliest time (seconds since the epoch) a worker may take it again.
ALTER TABLE batches ADD COLUMN run_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN retry_at DOUBLE PRECISION;
