-- Fair share by recent service (openrelay/store/fair_share.py): each organization's turn at each model's slots,
-- the database's clock when its last queued batch of the model started. The claim that starts a batch writes it,
-- in its own transaction under the model's lock; the next claim of the model orders the organizations by it.
-- Empty at first: every organization's turn starts equal, then the claims take turns.
CREATE TABLE model_shares (
    model VARCHAR(200) NOT NULL,
    org_id VARCHAR(40) NOT NULL REFERENCES organizations (id),
    last_started_at DOUBLE PRECISION NOT NULL,
    batches_started BIGINT NOT NULL,
    PRIMARY KEY (model, org_id)
);
