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

-- Coalesced change notices (openrelay/store/notices.py): when each organization's changes were last announced on
-- PostgreSQL. The trigger function and its deferred triggers are made by this version's hook
-- (coalesce_change_notices): function bodies hold semicolons. SQLite sends no notices and never writes it.
CREATE TABLE org_notices (
    org_id VARCHAR(40) NOT NULL PRIMARY KEY REFERENCES organizations (id),
    notified_at DOUBLE PRECISION NOT NULL
);
