"""A run that lost its lease cannot touch the chunks of the run that holds the batch now.

A worker paused past its lease (a long GC pause, a stopped VM) wakes up with finished records and writes them as
its next chunk. Another worker holds the batch by then and may have committed a chunk of the same number: the
stale run's blobs have keys of their own (``blobs.keys.chunk_key`` names the run), so they cannot overwrite the
committed chunk's, and its commit is refused (``LeaseLost``), so its records are not counted or billed twice.
The store and blobs here are the server's own, opened in the test process as a second worker would."""

from __future__ import annotations

import time

import pytest

from openrelay.blobs.keys import chunk_key, chunks_folder, output_key
from openrelay.config import Settings
from openrelay.lifecycle import End
from openrelay.runtime import open_runtime
from openrelay.store.results import Chunk, LeaseLost
from openrelay.worker.finalize import finalize_batch
from tests.support.batches import chat, create


def _chunk(batch_id: str, run: str, lines: list[int]) -> Chunk:
    return Chunk(seq=1, out_key=chunk_key(batch_id, 1, "out", run), err_key=None, lines=lines,
                 completed=len(lines), failed=0, input_tokens=10 * len(lines), output_tokens=len(lines),
                 cost_nano_usd=0)


def test_a_run_past_its_lease_cannot_overwrite_or_double_the_next_runs_chunk(make_server):
    server = make_server(args=("--no-worker",))  # this test is the only worker
    batch_id = create(server, [chat(f"r{i}", f"record {i}") for i in range(4)])["id"]
    rt = open_runtime(Settings.build(data_dir=server.data_dir, database_url=server.database_url,
                                     catalog_path=server.data_dir / "catalog.toml"))
    try:
        slots = {"test/echo": 1}
        stale = rt.leases.claim("worker-a", slots, lease_seconds=0.05)
        assert stale is not None and stale.id == batch_id
        deadline = time.monotonic() + 30
        while (current := rt.leases.claim("worker-b", slots, lease_seconds=60)) is None:
            assert time.monotonic() < deadline, "worker-a's lease never lapsed"
            time.sleep(0.05)
        assert current.id == batch_id

        held = _chunk(batch_id, "runb", [1, 2])  # worker-b's first chunk: records on lines 1 and 2
        with rt.blobs.writer(held.out_key) as out:
            out.write(b'{"custom_id": "r0"}\n{"custom_id": "r1"}\n')
        rt.results.commit_chunk(batch_id, "worker-b", current.key_id, held)
        rt.results.commit_chunk(batch_id, "worker-b", current.key_id, held)  # a retried commit: nothing added

        late = _chunk(batch_id, "runa", [1, 2, 3, 4])  # worker-a wakes with all four done, as its chunk 1
        assert late.out_key != held.out_key
        with rt.blobs.writer(late.out_key) as out:
            out.write(b"".join(f'{{"custom_id": "r{i}"}}\n'.encode() for i in range(4)))
        with pytest.raises(LeaseLost):
            rt.results.commit_chunk(batch_id, "worker-a", stale.key_id, late)

        with rt.blobs.open(held.out_key) as handle:
            assert handle.read() == b'{"custom_id": "r0"}\n{"custom_id": "r1"}\n'
        assert [(c.seq, c.out_key, c.lines) for c in rt.results.chunks(batch_id)] == [(1, held.out_key, [1, 2])]
        batch = rt.batches.get(current.org_id, batch_id)
        assert (batch.completed, batch.input_tokens) == (2, 20)

        # Cancelled and finalized by worker-b: the output holds its chunk alone, and worker-a's refused chunk,
        # which no row names, is gone with the committed one.
        rt.batches.request_cancel(current.org_id, batch_id)
        finalize_batch(rt, "worker-b", rt.batches.get(current.org_id, batch_id), End.CANCELLED)
        with rt.blobs.open(output_key(batch_id)) as handle:
            assert handle.read() == b'{"custom_id": "r0"}\n{"custom_id": "r1"}\n'
        assert not rt.blobs.exists(late.out_key) and not rt.blobs.exists(held.out_key)
        assert not list((server.data_dir / "blobs" / chunks_folder(batch_id)).parent.glob("chunks*"))
    finally:
        rt.db.dispose()


def test_the_window_is_judged_by_the_database_clock_as_measured_at_the_claim(make_server):
    server = make_server(args=("--no-worker",))
    batch_id = create(server, [chat("r0", "record 0")])["id"]
    rt = open_runtime(Settings.build(data_dir=server.data_dir, database_url=server.database_url,
                                     catalog_path=server.data_dir / "catalog.toml"))
    try:
        claimed = rt.leases.claim("worker-a", {"test/echo": 1}, lease_seconds=60)
        assert claimed is not None and claimed.id == batch_id
        # One machine here: the two clocks agree, bar the time between the reads, by which the skew may only be
        # more (the local clock is read first), and SQLite's clock, which counts whole milliseconds.
        assert -0.001 <= claimed.clock_skew < 60
        assert not claimed.past_window()
        # A worker whose own clock runs a window behind the database's still ends the batch in time ...
        behind = claimed.claimed_at(time.time() + (claimed.expires_at - time.time()) + 1, time.time())
        assert behind.past_window()
        # ... and one whose clock runs ahead does not end it early.
        ahead = claimed.claimed_at(time.time() - 3600, time.time())
        assert not ahead.past_window()
    finally:
        rt.db.dispose()
