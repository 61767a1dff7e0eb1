"""SSJF (Qiu et al., 2024): non-preemptive shortest *predicted* job first.

Waiting jobs are ordered by predicted output length (the proxy or retrieval predictor's, set
before submit) within their priority class; a job without a prediction sorts by its token
budget, i.e. last. Nothing is preempted. Starvation of long jobs, which the paper leaves to
future work ("one can adopt aging"), is bounded by the core's aging: a job that has waited
`scheduler.aging.slowdown` times its predicted service time goes ahead of every
non-promoted job (and may preempt one that has more work left).
"""

from __future__ import annotations

from daemon.core.job import Job
from daemon.core.policy import Policy, class_rank
from policies.common import true_remaining


class SSJF(Policy):
    name = "ssjf"

    def order_key(self, job: Job) -> float:
        return self.remaining_tokens(job)

    def engine_priority(self, job: Job) -> int:
        return class_rank(job.priority, self.remaining_tokens(job))


class OracleSJF(SSJF):
    """SSJF on the true output length: the bound on what a length predictor can give SSJF."""

    name = "oracle-sjf"
    uses_predictions = False
    benchmark_only = True  # the truth is known to benchmarks only

    def remaining_tokens(self, job: Job) -> float:
        return true_remaining(job)
