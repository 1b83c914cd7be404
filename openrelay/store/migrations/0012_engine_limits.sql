-- What the adaptive concurrency limiter of each engine replica learnt (openrelay/store/engine_limits.py): the
-- limit it ran at and its baseline latency, written by the workers as they go, so that a worker that starts (or
-- restarts) begins where the last one left off instead of climbing from min_concurrency again.
CREATE TABLE engine_limits (
    model VARCHAR(200) NOT NULL,
    replica VARCHAR(2000) NOT NULL,
    concurrency_limit INTEGER NOT NULL,
    baseline_seconds DOUBLE PRECISION NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (model, replica)
);
