"""Aging's look-ahead guard: the earliest deadline starts instead of the policy's pick only
when the pick would make a job miss a deadline it meets in deadline order."""

from __future__ import annotations

from daemon.core.guard import overrule, starts_within
from daemon.core.job import Job
from daemon.core.waitqueue import WaitQueue
from tests.policies.fakes import job

BOUND_S = 10.0  # every job may wait 10 s


def _service(j: Job) -> float:
    """The tests' service times, seconds: the prediction, read as seconds."""
    return j.predicted_output_tokens or 0.0


def _waiting(*jobs: Job) -> WaitQueue:
    queue = WaitQueue(lambda j: -_service(j), lambda j: BOUND_S)  # longest first: a bad order
    for j in jobs:
        queue.push(j)
    return queue


def test_starts_are_list_scheduled_on_the_earliest_free_slot() -> None:
    # Slots free in 0 s and 4 s; in order: the first starts at 0 (its slot frees at 6), the
    # second at 4 (frees at 5), the third at 5, half a second past its deadline.
    assert starts_within([100.0, 104.0, 104.5], [6.0, 1.0, 1.0], [0.0, 4.0], now=100.0) == [
        True, True, False]
    assert starts_within([], [], [0.0], now=0.0) == []


def test_a_pick_that_makes_the_earliest_deadline_miss_is_overruled() -> None:
    due = job("due", predicted=3.0, enqueue=0.0)  # deadline 10
    long = job("long", predicted=20.0, enqueue=5.0)  # deadline 15
    assert overrule(long, _waiting(due, long), _service, [], 1, now=0.0) is due
    # Two slots: `due` starts at once beside the long job; nothing to overrule.
    assert overrule(long, _waiting(due, long), _service, [], 2, now=0.0) is None


def test_a_pick_that_leaves_every_deadline_met_stands() -> None:
    due = job("due", predicted=3.0, enqueue=0.0)  # deadline 10
    short = job("short", predicted=5.0, enqueue=5.0)  # runs 0-5, `due` still starts by 10
    assert overrule(short, _waiting(due, short), _service, [], 1, now=0.0) is None
    # The pick is the earliest deadline itself: deadline order starts it too, even though
    # `next_due` then misses.
    head = job("head", predicted=20.0, enqueue=0.0)  # deadline 10
    next_due = job("next", predicted=1.0, enqueue=1.0)  # deadline 11, starts at 20
    assert overrule(head, _waiting(head, next_due), _service, [], 1, now=0.0) is None


def test_running_jobs_hold_their_slots() -> None:
    due = job("due", predicted=3.0, enqueue=0.0)  # deadline 10
    running = [job("r", predicted=12.0)]  # one of two slots, busy for 12 s
    late = job("late", predicted=11.0, enqueue=5.0)  # in the free slot: `due` starts at 11
    assert overrule(late, _waiting(due, late), _service, running, 2, now=0.0) is due
    soon = job("soon", predicted=9.0, enqueue=5.0)  # `due` starts at 9
    assert overrule(soon, _waiting(due, soon), _service, running, 2, now=0.0) is None


def test_a_job_that_misses_in_deadline_order_anyway_is_no_reason_to_overrule() -> None:
    first = job("first", predicted=20.0, enqueue=0.0)  # deadline 10: starts at 0 either way
    lost = job("lost", predicted=3.0, enqueue=1.0)  # deadline 11: behind `first`, starts at 20
    pick = job("pick", predicted=5.0, enqueue=5.0)  # pushes `first` to 5: still in time
    assert overrule(pick, _waiting(first, lost, pick), _service, [], 1, now=0.0) is None


def test_without_aging_there_are_no_deadlines_to_guard() -> None:
    due, long = job("due", predicted=3.0), job("long", predicted=20.0)
    queue = WaitQueue(lambda j: -_service(j), None)
    queue.push(due)
    queue.push(long)
    assert overrule(long, queue, _service, [], 1, now=0.0) is None
