"""An executor's predicted outstanding work as running totals, so that placing a job reads
one number per executor instead of summing over every running job (O(executors), not
O(executors x slots)).

Two sums over the jobs admitted to an executor, both from a job's own state only:
- tokens: predicted remaining output tokens (`Job.predicted_remaining_tokens`);
- context_reads: the context tokens those remaining decode steps read, step by step
  (context + 1, context + 2, ...): out x (context + (out + 1) / 2). With `tokens` it gives any
  linear decode cost over the jobs (CostModel.decode_total_s: ALISE's remaining time).

A job's share is recomputed whenever it changes (its executor sets `Job.on_work_change`,
called on every delta and by `Job.set_prediction`) and the difference is added, so a total
tracks the sum up to float rounding; it is exactly 0 again whenever the executor empties.
"""

from __future__ import annotations

from daemon.core.costmodel import context_reads
from daemon.core.job import Job


def job_work(job: Job) -> tuple[float, float]:
    """(predicted remaining tokens, context tokens their decode steps read) of one job."""
    out = job.predicted_remaining_tokens
    return out, context_reads(job.num_context_tokens, out)


class RunningWork:
    """Σ job_work over a changing set of jobs, one O(1) update per change."""

    __slots__ = ("_of", "context_reads", "tokens")

    def __init__(self) -> None:
        self.tokens = 0.0
        self.context_reads = 0.0
        self._of: dict[str, tuple[float, float]] = {}  # job id -> its share as last added

    def __len__(self) -> int:
        return len(self._of)

    def add(self, job: Job) -> None:
        self.remove(job)  # a job counts once
        share = self._of[job.job_id] = job_work(job)
        self.tokens += share[0]
        self.context_reads += share[1]

    def update(self, job: Job) -> None:
        """The job's prediction or progress changed: replace its share (if it is counted)."""
        old = self._of.get(job.job_id)
        if old is None:
            return
        share = self._of[job.job_id] = job_work(job)
        self.tokens += share[0] - old[0]
        self.context_reads += share[1] - old[1]

    def remove(self, job: Job) -> None:
        old = self._of.pop(job.job_id, None)
        if old is None:
            return
        if not self._of:  # empty: exactly zero, whatever rounding the sums gathered
            self.tokens = self.context_reads = 0.0
        else:
            self.tokens -= old[0]
            self.context_reads -= old[1]
