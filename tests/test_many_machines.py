"""Many machines, simulated honestly: `orl serve --no-worker` and three `orl worker` processes, each with its own
working directory and ``--data-dir``, sharing only the database and one S3 bucket (a real SeaweedFS).

On PostgreSQL (``OPENRELAY_TEST_DB=postgres``) the processes share exactly what separate machines would: the
database server and the bucket. On the SQLite pass they also share the SQLite database file, in a directory of its
own that is nobody's data dir: that is the one thing SQLite cannot serve over a network, and it holds no blob.

Any code path that still wrote a blob (an upload, a result chunk, a composed file) to local disk, or read one from
a path another process wrote, fails here: a worker would not find the input the API stored, the API would not find
the results a worker wrote, a resuming worker would not find the chunks a killed one made durable; and afterwards
each data dir is checked to hold nothing but what its own process keeps there (the API its bootstrap key).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BACKEND
from tests.support.batches import chat, create, create_from_file, get, results, usage_of, wait_for
from tests.support.seaweed import S3Bucket, s3_bucket, seaweed  # noqa: F401  (session fixtures)
from tests.support.server import TEST_CATALOG, Server, create_pg_database, drop_pg_database, free_port
from tests.support.workers import WorkerProcess

pytestmark = pytest.mark.slow  # SeaweedFS

TIMING = {"OPENRELAY_TICK_SECONDS": "0.05", "OPENRELAY_RETRY_BASE_SECONDS": "0.05", "OPENRELAY_LEASE_SECONDS": "3",
          "OPENRELAY_FLUSH_RECORDS": "2"}  # chunks of two records: several chunk objects per batch


@dataclass
class Machine:
    """One process's own directory: its ``data/`` (the ``--data-dir``), its catalog and its log beside it."""

    root: Path
    worker: WorkerProcess | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "out.log"

    def took(self, batch_id: str) -> bool:
        return self.worker is not None and self.worker.took(batch_id)

    def files_in_data_dir(self) -> list[str]:
        return sorted(str(p.relative_to(self.data_dir)) for p in self.data_dir.rglob("*") if p.is_file())

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill()


class Cluster:
    def __init__(self, root: Path, engine_url: str, bucket: S3Bucket, *, slots: int, concurrency: int) -> None:
        self.root = root
        self.bucket = bucket
        self.prefix = "machines-" + secrets.token_hex(4)
        self.catalog = TEST_CATALOG.format(engine=engine_url, slots=slots, concurrency=concurrency)
        if BACKEND == "postgres":
            self.database_url = create_pg_database()
        else:
            (root / "shared-db").mkdir()
            self.database_url = f"sqlite:///{root / 'shared-db' / 'openrelay.db'}"
        # Workers take the bucket from the environment, the API from its flag: both ways are used.
        self.env = {**bucket.server.env(), **TIMING}
        self.workers: list[Machine] = []
        self.api_machine = self._machine("api")
        self.api = Server(data_dir=self.api_machine.data_dir, database_url=self.database_url, port=free_port(),
                          env=self.env, args=["--no-worker", "--blob-url", bucket.url(self.prefix),
                                              "--catalog", str(self.api_machine.root / "catalog.toml")])
        self.api.log_path = self.api_machine.log_path  # beside its data dir, not in it
        self.api.start()

    def _machine(self, name: str) -> Machine:
        machine = Machine(root=self.root / name)
        machine.data_dir.mkdir(parents=True)
        (machine.root / "catalog.toml").write_text(self.catalog)
        return machine

    def start_worker(self) -> Machine:
        machine = self._machine(f"worker-{len(self.workers)}")
        # cwd: its own directory, so nothing relative to the working directory can land somewhere shared.
        machine.worker = WorkerProcess(
            data_dir=machine.data_dir, database_url=self.database_url, catalog=machine.root / "catalog.toml",
            log_path=machine.log_path, env={**self.env, "OPENRELAY_BLOB_URL": self.bucket.url(self.prefix)},
            cwd=machine.root)
        self.workers.append(machine)
        return machine

    def assert_no_blob_on_local_disk(self) -> None:
        assert self.api_machine.files_in_data_dir() == ["api-key"]  # written at bootstrap; the test reads it there
        for worker in self.workers:
            assert worker.files_in_data_dir() == [], worker.root.name
        if BACKEND != "postgres":
            names = {p.name for p in (self.root / "shared-db").iterdir()}
            assert names <= {"openrelay.db", "openrelay.db-wal", "openrelay.db-shm"}, names

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.api.stop()
        if BACKEND == "postgres":
            drop_pg_database(self.database_url)


@pytest.fixture
def cluster(tmp_path: Path, engine_url: str, s3_bucket: S3Bucket) -> Iterator[Cluster]:  # noqa: F811
    made = Cluster(tmp_path, engine_url, s3_bucket, slots=3, concurrency=4)
    try:
        yield made
    finally:
        made.close()


def _sent(engine) -> Counter[str]:
    return Counter(r["body"]["messages"][0]["content"] for r in engine.requests())


def test_batches_run_across_machines_sharing_only_the_database_and_the_bucket(cluster: Cluster, engine) -> None:
    for _ in range(3):
        cluster.start_worker()
    server = cluster.api
    made = []
    for b in range(2):
        records = [chat(f"in{b}-{i}", f"inline {b} record {i}") for i in range(7)]
        made.append((create(server, [*records, chat(f"in{b}-bad", f"refused {b} #status=400")]), f"in{b}", 7))
    for b in range(2):
        records = [chat(f"file{b}-{i}", f"file {b} record {i}") for i in range(9)]
        made.append((create_from_file(server, records), f"file{b}", 9))

    for batch, prefix, count in made:
        done = server.wait(batch["id"], timeout=120)
        assert done["status"] == "completed", done
        out, err = results(server, done)  # downloaded through the API: each custom_id on one line
        assert sorted(out) == sorted(f"{prefix}-{i}" for i in range(count))
        assert sorted(err) == ([f"{prefix}-bad"] if prefix.startswith("in") else [])
        assert done["usage"] == usage_of(out)  # billed once
    sent = _sent(engine)
    assert len(sent) == 2 * 8 + 2 * 9 and set(sent.values()) == {1}  # each once, refused ones too

    keys = cluster.bucket.keys(cluster.prefix + "/")
    assert not [k for k in keys if "/chunks/" in k]  # composed into the result files, then removed
    assert all(k.startswith((f"{cluster.prefix}/files/", f"{cluster.prefix}/batches/")) for k in keys)
    cluster.assert_no_blob_on_local_disk()


def test_a_killed_workers_chunks_are_composed_by_the_worker_that_resumes_its_batch(cluster: Cluster,
                                                                                  engine) -> None:
    first = cluster.start_worker()
    server = cluster.api
    records = [chat(f"k{i}", f"record {i}") for i in range(6)] + [chat(f"k{i}", f"record {i} #hold=k")
                                                                  for i in range(6, 12)]
    batch_id = create(server, records)["id"]
    engine.wait_held("k", 4)
    # The six answered records made durable by the first worker: chunk objects it wrote, on no shared disk.
    wait_for(lambda: get(server, batch_id)["request_counts"]["completed"] == 6, "six records durable")
    assert first.took(batch_id)
    second = cluster.start_worker()
    first.stop()  # kill -9: the lease lapses, the second machine takes the batch over
    engine.wait_held("k", 8)  # the four in flight sent again by the second worker
    engine.release("k")
    done = server.wait(batch_id, timeout=120)
    assert done["status"] == "completed" and done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert second.took(batch_id)
    out, err = results(server, done)
    assert sorted(out) == sorted(f"k{i}" for i in range(12)) and err == {}
    assert done["usage"] == usage_of(out)  # the repeated in-flight calls billed once
    sent = _sent(engine)
    assert sum(sent.values()) == 16 and sorted(sent.values()).count(2) == 4  # only the four in flight, twice
    cluster.assert_no_blob_on_local_disk()
