-- Workers that spread by themselves (openrelay/store/workers.py): each worker process registers here and renews
-- its row as it goes (a heartbeat, on the database's clock). A row past ``expires_at`` is a worker gone: it no
-- longer counts among the live workers that share a model's slots, and the next heartbeat of any worker deletes
-- it. ``models``: the models its catalog serves, one per line (a model's slots are shared by the workers serving
-- it). ``orl admin workers`` lists the live ones.
CREATE TABLE workers (
    id VARCHAR(200) NOT NULL PRIMARY KEY,
    host VARCHAR(255) NOT NULL,
    pid INTEGER NOT NULL,
    version VARCHAR(40) NOT NULL,
    models TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    last_seen_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
