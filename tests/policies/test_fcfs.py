"""FCFS: arrival order, whatever the predictions, and a job that comes back keeps its place."""

from __future__ import annotations

from daemon.core.waitqueue import WaitQueue
from policies.fcfs import FCFS
from tests.policies.fakes import job


def test_arrival_order_ignores_predictions_and_keeps_a_returning_jobs_place() -> None:
    policy = FCFS()
    queue = WaitQueue(policy.order_key, None)
    early = job("early", predicted=4000.0)
    early.arrival_time = 1.0
    late = job("late", predicted=5.0)
    late.arrival_time = 2.0
    # Preempted after its first run, `early` re-enters the waiting set after `late` did.
    late.enqueue_time, early.enqueue_time = 3.0, 9.0
    queue.push(late)
    queue.push(early)
    assert [queue.pop(10.0), queue.pop(10.0)] == [early, late]
    assert not policy.uses_predictions and not policy.aged
