"""``worker.dispatch``: which prefix groups a worker takes for warm in the engine's cache (``ModelGroups``, on a
clock the test moves), and the order a run's ``DispatchQueue`` hands its records out in (a real local blob store
holding the input and its stored dispatch order)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson

from openrelay.blobs.keys import dispatch_order_key
from openrelay.blobs.local import LocalBlobStore
from openrelay.prefix import ENTRY, DispatchEntry
from openrelay.types import Batch, BatchStatus
from openrelay.worker.dispatch import DispatchQueue, ModelGroups, Pending


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_group_is_warm_after_an_answer_and_cold_again_two_seconds_later() -> None:
    clock = Clock()
    groups = ModelGroups(clock)
    assert not groups.is_warm(7)
    groups.started(7)
    assert groups.hot() == [7] and not groups.is_warm(7)  # its leader is out: no answer yet, so not warm
    groups.finished(7)
    assert groups.hot() == [] and groups.is_warm(7)
    clock.now += 1.9
    assert groups.is_warm(7)
    clock.now += 0.2
    assert not groups.is_warm(7)  # a batch started now sends a leader of it first again


def test_each_answer_renews_its_group_and_old_groups_are_forgotten() -> None:
    clock = Clock()
    groups = ModelGroups(clock)
    for group in (1, 2):
        groups.started(group)
        groups.finished(group)
    clock.now += 1.5
    groups.started(1)
    groups.finished(1)
    clock.now += 1.0
    assert groups.is_warm(1) and not groups.is_warm(2)
    clock.now += 5.0
    groups.started(3)
    groups.finished(3)  # the oldest answers are dropped as new ones come: memory stays bounded
    assert list(groups._answered) == [3]
    assert groups.is_warm(3) and not groups.is_warm(1)


def test_group_zero_is_no_group() -> None:
    groups = ModelGroups(Clock())
    groups.started(0)
    groups.finished(0)
    assert groups.hot() == [] and not groups.is_warm(0)


# --- the order a run hands its records out in


def _queue(tmp_path: Path, groups: dict[int, int], in_flight: int | Callable[[], int],
           warm: ModelGroups | None = None) -> DispatchQueue:
    """A queue over a batch whose stored order holds ``groups`` (group: its records), in that order; record
    ``g{group}-{i}`` is the ``i``-th of its group (0: its leader)."""
    blobs = LocalBlobStore(tmp_path)
    lines, entries, offset = [], [], 0
    for group, size in groups.items():
        for i in range(size):
            raw = orjson.dumps({"custom_id": f"g{group}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "m", "messages": []}})
            lines.append(raw)
            entries.append(DispatchEntry(len(lines), offset, len(raw), group, 256))
            offset += len(raw) + 1
    with blobs.writer("files/input") as out:
        out.write(b"\n".join(lines) + b"\n")
    with blobs.writer(dispatch_order_key("batch_q")) as out:
        out.write(b"".join(ENTRY.pack(*entry) for entry in entries))
    batch = Batch(id="batch_q", org_id="org", key_id="key", endpoint="/v1/chat/completions", input_file_id="file",
                  input_blob_key="files/input", completion_window="24h", priority="standard",
                  status=BatchStatus.IN_PROGRESS, model="m", created_at=0, expires_at=86_400)
    return DispatchQueue(blobs, batch, set(), 1 << 20, grouping=True, groups=warm or ModelGroups(),
                         in_flight=in_flight if callable(in_flight) else lambda: in_flight)


def _id(item: Pending | None) -> str:
    assert item is not None and not isinstance(item[1], Exception)
    return item[1]["custom_id"]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_next_group_warms_as_soon_as_one_is_all_sent(tmp_path: Path) -> None:
    """Room for 8 calls: two groups warm at once (``warming_allowed``). When the first group's records have all gone,
    the third group's leader goes ahead of the second group's records, already released, so that it warms while
    they go. (Taken only once every released record was out, the leaders went in waves with the lanes idle
    between: on bench_scheduling's test engine 2.3 s against 1.8 s.)"""
    async def run() -> list[str]:
        queue = _queue(tmp_path, {1: 4, 2: 4, 3: 4}, in_flight=8)
        order = [_id(await queue.take()), _id(await queue.take())]  # both leaders
        blocked = asyncio.create_task(queue.take())
        await _settle()
        assert not blocked.done()  # two groups warming: the third waits, and nothing else may go
        queue.done(1)  # the first leader's answer
        order.append(_id(await blocked))
        queue.done(2)  # the second's: its records are released behind the first group's
        while (item := await queue.take()) is not None:
            order.append(_id(item))
            if order[-1] not in ("g3-0", "g2-3"):
                queue.done(item[2])  # answered at once
            elif {"g3-0", "g2-3"} <= set(order):
                queue.done(3)  # the third group's leader answers once the second group has gone
        return order

    assert asyncio.run(run()) == ["g1-0", "g2-0", "g1-1", "g1-2", "g1-3", "g3-0", "g2-1", "g2-2", "g2-3", "g3-1",
                                  "g3-2", "g3-3"]


def test_a_run_takes_no_more_records_than_it_may_have_in_flight(tmp_path: Path) -> None:
    """With an adaptive limit a run has more lanes than the limit: a lane takes a record only once one of the
    run's records out has ended, so what goes next is decided when it can go, not in the limiter's queue."""
    async def run() -> None:
        warm = ModelGroups(Clock())
        warm.started(5)
        warm.finished(5)  # a group the engine has just answered: its records go without a leader
        queue = _queue(tmp_path, {5: 6}, in_flight=3, warm=warm)
        taken = [_id(await queue.take()) for _ in range(3)]  # all six are read at once; three may go
        waiting = asyncio.create_task(queue.take())
        await _settle()
        assert not waiting.done()
        queue.done(5)
        taken.append(_id(await waiting))
        assert taken == ["g5-0", "g5-1", "g5-2", "g5-3"]

    asyncio.run(run())


def test_with_every_replica_out_one_record_still_goes_to_wait_for_one(tmp_path: Path) -> None:
    """The limit is 0 while every replica is out of rotation: one record is still taken, to wait in the engine gate
    where a cancel or the window's end stops it (taking none, the run would wait for an answer that cannot come)."""
    async def run() -> None:
        limit = [0]
        warm = ModelGroups(Clock())
        warm.started(5)
        warm.finished(5)
        queue = _queue(tmp_path, {5: 3}, in_flight=lambda: limit[0], warm=warm)
        assert _id(await queue.take()) == "g5-0"
        waiting = asyncio.create_task(queue.take())
        await _settle()
        assert not waiting.done()
        limit[0] = 2  # a replica is back
        queue.done(5)
        assert _id(await waiting) == "g5-1"

    asyncio.run(run())
