"""First come, first served: the baseline every other policy is measured against."""

from __future__ import annotations

from daemon.core.job import Job
from daemon.core.policy import Policy


class FCFS(Policy):
    name = "fcfs"
    uses_predictions = False
    aged = False  # arrival order is the wait bound

    def order_key(self, job: Job) -> float:
        # Arrival, not enqueue time: a job that comes back keeps its place in line.
        return job.arrival_time
