-- Cached and reasoning tokens on the bill (openrelay/worker/usage.py): what the engines' usage details report,
-- prompt_tokens_details.cached_tokens (billed at the model's cached_input_usd_per_mtok) and
-- completion_tokens_details.reasoning_tokens, summed per chunk and per batch as input and output tokens are, and
-- shown in the batch's usage in the OpenAI SDK's BatchUsage shape. Batches and chunks from before count 0.
ALTER TABLE batches ADD COLUMN cached_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batch_chunks ADD COLUMN cached_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batch_chunks ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
-- The adaptive concurrency limit in force for a running batch, as its worker last wrote it
-- (Batches.set_concurrency_limit), for the progress object; null when unknown.
ALTER TABLE batches ADD COLUMN concurrency_limit INTEGER;
