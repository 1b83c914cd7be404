"""The test engine's scheduler (tests/support/engine_simulation.py): who runs, who waits, who is preempted."""

from __future__ import annotations

from tests.support.engine_simulation import Job, Scheduler, Simulation


def test_the_latest_of_the_highest_value_is_preempted_and_waits_in_its_old_place() -> None:
    scheduler = Scheduler(Simulation(slots=3, scheduling="priority", preempt=True))
    early, late, low = Job(priority=7), Job(priority=7), Job(priority=1)
    for job in (early, late, low):
        assert scheduler.arrive(job) == [job]
    newcomer, queued = Job(priority=0), Job(priority=7)
    assert scheduler.arrive(queued) == []  # 7 is not lower than any running value: it waits
    assert scheduler.arrive(newcomer) == [late, newcomer]  # late stops, newcomer starts
    assert (late.running, scheduler.waiting, scheduler.preemptions) == (False, [late, queued], 1)
    assert scheduler.leave(low) == [late]  # it arrived before the one queued at the same value


def test_more_slots_start_the_waiting_in_order_and_no_limit_starts_everyone() -> None:
    scheduler = Scheduler(Simulation(slots=1))
    jobs = [Job(priority=p) for p in (3, 2, 1)]
    assert [scheduler.arrive(job) for job in jobs] == [[jobs[0]], [], []]
    assert scheduler.configure(Simulation(slots=2, scheduling="priority")) == [jobs[2]]
    assert scheduler.configure(Simulation()) == [jobs[1]]
    assert (len(scheduler.running), scheduler.waiting, scheduler.max_waiting) == (3, [], 2)
