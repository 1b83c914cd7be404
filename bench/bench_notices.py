"""What the read cache's change notices cost the workers' chunk commits on PostgreSQL, code against code.

    git archive c94fd38 openrelay | tar -x -C /tmp/before      # a notice at every commit (migration 0010's trigger)
    git archive 3149c8f openrelay | tar -x -C /tmp/main        # coalesced in the trigger (migration 0015)
    .venv/bin/python bench/bench_notices.py --code before=/tmp/before main=/tmp/main now=. \\
        [--connections 8 32] [--orgs 1] [--commits 300] [--rounds 2] [--writes chunk update raw]

Each code (a folder holding an ``openrelay`` package) gets a fresh database of the test PostgreSQL server
(``OPENRELAY_TEST_PG``, dropped afterwards), migrated by that code. Then, per round, write and connection count,
the codes one after the other: ``--connections`` threads, 8 per process (each process its own ``Database``, so its
own notifier, as each worker process has), each making ``--commits`` writes of its own running batch through that
code's store (``synchronous_commit`` on). The writes (``--writes``): ``chunk``, the commit the workers make for
every chunk (``Results.commit_chunk``); ``update``, a one-statement write through ``Database.write``; ``raw``, that
update on a bare psycopg connection, each code's notices sent as its store sends them, whose client costs so little
that the database, not Python on a loaded machine, sets the rate. The batches belong to ``--orgs`` organizations.
One session LISTENs, as an API process does. Prints commits/s of each (from the moment every process is ready to
the last commit) and the notices the listener heard.
``--triggers-off NAME``: that code's database has its triggers disabled (for the code before, the rate with no
notices at all: the ceiling of the database itself).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psycopg

ROOT = Path(__file__).resolve().parents[1]
THREADS_PER_PROCESS = 8  # a Database's pool holds 8 connections (and 8 more in overflow)
WRITES = {
    "chunk": "a chunk's commit (Results.commit_chunk: five statements)",
    "update": "one update a poll can see (completed + 1), in Database.write, announced as the store's writes are",
    "raw": "the same update on a bare psycopg connection, then handed to the notifier as Database.write does",
}


def _child_env(code: str) -> dict[str, str]:
    """A process that imports ``openrelay`` from ``code`` and the test support from this checkout."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(code).resolve()), str(ROOT)])}


def _child(command: str, code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--child", command, *args], env=_child_env(code),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


# -- in a child process, on its code's openrelay ------------------------------------------------------------------

def child_seed(url: str, orgs: int, batches: int) -> None:
    """Migrate the database with this code and make ``batches`` running batches over ``orgs`` organizations."""
    from openrelay.store.accounts import Accounts
    from openrelay.store.db import Database
    from tests.support.store_rows import insert_running_batch

    db = Database(url)
    db.migrate()
    accounts = Accounts(db)
    made = [accounts.create_org(f"bench-{n}") for n in range(orgs)]
    keys = [accounts.create_key(org.id)[0] for org in made]
    with db.write() as conn:
        for i in range(batches):
            insert_running_batch(conn, batch_id=f"bench-{i}", org_id=made[i % orgs].id, key_id=keys[i % orgs].id,
                                 created_ns=i, lease_owner="bench")
    db.dispose()


def child_commit(url: str, write: str, first: int, threads: int, commits: int) -> None:
    """``threads`` threads, each making ``commits`` writes (``WRITES``) of its batch (``bench-<first + n>``) once
    told to on stdin; prints the seconds from then to the last commit."""
    import sqlalchemy as sa

    from openrelay.store.db import Database
    from openrelay.store.results import Chunk, Results

    db = Database(url)
    results = Results(db)
    try:
        from openrelay.store.notices import announce, collect_announced
    except ImportError:  # the code before notices left the commit: its triggers notify
        def announce(conn: sa.Connection, *, batch_id: str) -> None:
            pass

        def notify(batch_id: str) -> None:
            pass
    else:
        def notify(batch_id: str) -> None:
            """What ``Database.write`` does after a commit that announced ``batch_id``."""
            committed = SimpleNamespace(info={})
            announced = collect_announced(committed)  # type: ignore[arg-type]
            announce(committed, batch_id=batch_id)  # type: ignore[arg-type]
            db.notifier.changed(announced)

    with db.read() as conn:
        key_id = conn.execute(sa.text("SELECT key_id FROM batches WHERE id = :b"), {"b": f"bench-{first}"}).scalar()
        seqs = dict(conn.execute(sa.text("SELECT batch_id, coalesce(max(seq), -1) + 1 FROM batch_chunks "
                                         "GROUP BY batch_id")).all())
    go = threading.Event()

    def work(batch_id: str) -> None:
        seq = seqs.get(batch_id, 0)
        raw = psycopg.connect(url, autocommit=True) if write == "raw" else None
        go.wait()
        for n in range(seq, seq + commits):
            if raw is not None:
                raw.execute("UPDATE batches SET completed = completed + 1 WHERE id = %s", (batch_id,))
                notify(batch_id)
            elif write == "chunk":
                results.commit_chunk(batch_id, "bench", key_id, Chunk(
                    seq=n, out_key=f"o{n}", err_key=None, lines=[n], completed=1, failed=0, input_tokens=10,
                    output_tokens=10, cost_nano_usd=0))
            else:
                with db.write() as conn:
                    conn.execute(sa.text("UPDATE batches SET completed = completed + 1 WHERE id = :b"),
                                 {"b": batch_id})
                    announce(conn, batch_id=batch_id)

    workers = [threading.Thread(target=work, args=(f"bench-{first + n}",)) for n in range(threads)]
    for worker in workers:
        worker.start()
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    go.set()
    for worker in workers:
        worker.join()
    print(f"{time.perf_counter() - started:.6f}", flush=True)
    db.dispose()  # what is still waiting is notified before the process goes


# -- the parent ---------------------------------------------------------------------------------------------------

def commits_per_second(url: str, code: str, write: str, connections: int, commits: int) -> float:
    processes = [_child("commit", code, url, write, str(first), str(min(THREADS_PER_PROCESS, connections - first)),
                        str(commits)) for first in range(0, connections, THREADS_PER_PROCESS)]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    seconds = max(float(process.stdout.readline()) for process in processes if process.stdout is not None)
    for process in processes:
        if process.wait() != 0:
            raise RuntimeError(f"a committing process failed ({process.returncode})")
    return connections * commits / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", nargs="+", default=["now=."], help="NAME=FOLDER holding an openrelay package")
    parser.add_argument("--connections", type=int, nargs="+", default=[8])
    parser.add_argument("--orgs", type=int, default=1, help="organizations the batches are spread over")
    parser.add_argument("--commits", type=int, default=300, help="chunk commits per connection and case")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--writes", nargs="+", choices=list(WRITES), default=list(WRITES))
    parser.add_argument("--triggers-off", nargs="*", default=[], metavar="NAME",
                        help="codes whose database has its triggers disabled: the rate with no notices at all")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        command, *rest = args.child
        if command == "seed":
            child_seed(rest[0], int(rest[1]), int(rest[2]))
        else:
            child_commit(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]))
        return

    sys.path.insert(0, str(ROOT))
    from tests.support.server import create_pg_database, drop_pg_database

    codes = dict(entry.split("=", 1) for entry in args.code)
    urls: dict[str, str] = {}
    try:
        for name, code in codes.items():
            urls[name] = create_pg_database()
            seed = _child("seed", code, urls[name], str(args.orgs), str(max(args.connections)))
            if seed.wait() != 0:
                raise RuntimeError(f"seeding the database of {name} failed")
            if name in args.triggers_off:
                with psycopg.connect(urls[name], autocommit=True) as conn:
                    conn.execute("ALTER TABLE batches DISABLE TRIGGER USER")
                    conn.execute("ALTER TABLE batch_tags DISABLE TRIGGER USER")
        listeners = {name: psycopg.connect(url, autocommit=True) for name, url in urls.items()}
        for listener in listeners.values():
            listener.execute("LISTEN openrelay_batches")
        for n in range(1, args.rounds + 1):
            for write in args.writes:
                for connections in args.connections:
                    for name, code in codes.items():
                        rate = commits_per_second(urls[name], code, write, connections, args.commits)
                        heard = 0
                        while got := sum(1 for _ in listeners[name].notifies(timeout=0.5)):
                            heard += got
                        print(f"round {n}, {WRITES[write]}, {connections} connections, {name}: {rate:,.0f} "
                              f"commits/s ({heard} notices heard for {connections * args.commits} commits; "
                              f"load {os.getloadavg()[0]:.1f})", flush=True)
        for listener in listeners.values():
            listener.close()
    finally:
        for url in urls.values():
            drop_pg_database(url)


if __name__ == "__main__":
    main()
