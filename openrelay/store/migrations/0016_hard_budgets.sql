-- Hard budgets, opt-in per key (store/budgets.py): a key with hard_budget reserves each batch's maximum cost when
-- the batch is created; reserved_nano_usd on the key is the sum of what its running batches still hold, and on the
-- batch what it holds itself. Settled records turn the batch's share into spend; its end releases the rest.
ALTER TABLE api_keys ADD COLUMN hard_budget BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE api_keys ADD COLUMN reserved_nano_usd BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN reserved_nano_usd BIGINT NOT NULL DEFAULT 0;
