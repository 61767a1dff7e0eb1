"""ALISE's estimated wait time (EWT) and the swap decisions made from it.

The paper's Eq. 6-7 and Algorithm 2 are lost in the text; this is reconstructed from its
prose:
- Eq. 6: "for a job with priority p, the EWT is the sum of the execution times of jobs with
  higher priority". With several executors serving in parallel, that work drains
  `servers` times faster, and the work of running jobs is ahead of every waiting job.
- Eq. 7: "due to aging (age threshold), we also need to compare the time needed to promote
  to the high-priority queue for execution": with virtual aging a job climbs one level
  (log2 of its remaining time) per age threshold; it runs once its aged level beats the
  worst running job's. EWT is the smaller of the two, and also at most the time until the
  core's hard aging promotes it.
- Algorithm 2: queue by queue from the highest priority, jobs sorted by EWT; the first ones
  up to the GPU job limit keep their KV on the GPU (uploading if needed), the rest are
  offloaded; the limit is shared across queues. Per executor here, since KV is per engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.core.job import Job, KVResidency


@dataclass(slots=True)
class Waiter:
    job: Job
    level: float  # effective (aged) priority level now: log2(remaining seconds) - wait/θ
    work_s: float  # estimated remaining execution time, seconds
    promote_in_s: float | None  # seconds until the core's aging promotes it; None = never
    ewt_s: float = 0.0


def estimate_waits(waiters: Sequence[Waiter], running_work_s: float, servers: int,
                   run_level: float | None, age_threshold_s: float) -> None:
    """Fill each waiter's ewt_s; `waiters` must be in priority order (best first).

    run_level: the aged level a waiter must reach to take a running job's place (None when
    nothing runs: then only the work ahead counts).
    """
    ahead_s = running_work_s
    for w in waiters:
        ewt = ahead_s / max(servers, 1)
        if run_level is not None:
            ewt = min(ewt, max(w.level - run_level, 0.0) * age_threshold_s)
        if w.promote_in_s is not None:
            ewt = min(ewt, max(w.promote_in_s, 0.0))
        w.ewt_s = ewt
        ahead_s += w.work_s


def plan_residency(waiters: Sequence[Waiter], limit_per_executor: int,
                   offload: bool) -> dict[str, KVResidency]:
    """KEEP / OFFLOAD-or-DROP for each waiter whose KV was computed before (preempted or
    sliced), by job id. Queues are whole priority levels, best first; EWT orders within."""
    spill = KVResidency.OFFLOAD if offload else KVResidency.DROP
    used: dict[str, int] = {}
    decisions: dict[str, KVResidency] = {}
    holders = [w for w in waiters if w.job.num_dispatches > 0 and w.job.executor_name]
    for w in sorted(holders, key=lambda w: (math.floor(w.level), w.ewt_s)):
        where = w.job.executor_name or ""
        if used.get(where, 0) < limit_per_executor:
            used[where] = used.get(where, 0) + 1
            decisions[w.job.job_id] = KVResidency.KEEP
        else:
            decisions[w.job.job_id] = spill
    return decisions
