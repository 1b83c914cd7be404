"""``worker.dispatch.ModelGroups``: which prefix groups a worker takes for warm in the engine's cache, on a clock the
test moves."""

from __future__ import annotations

from openrelay.worker.dispatch import ModelGroups


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
