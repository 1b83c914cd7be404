-- Whether a running batch's worker leaves its engine to others' requests now (yield_to_interactive,
-- openrelay/worker/engine_load.py): the progress object's ``yielding``.
ALTER TABLE batches ADD COLUMN yielding BOOLEAN NOT NULL DEFAULT FALSE;
