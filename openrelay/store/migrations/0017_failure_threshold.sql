-- A batch's failure_threshold (openrelay/failure_threshold.py): the early abort's rule as the create took it,
-- JSON {"error_rate": .., "min_records": ..}, or null for a batch that runs to its end whatever fails.
ALTER TABLE batches ADD COLUMN failure_threshold TEXT;
