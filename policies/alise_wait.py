"""ALISE's estimated wait time (EWT) and the swap decisions made from it.

The paper's Eq. 6-7 and Algorithm 2 are lost in the text; this is reconstructed from its
prose:
- Eq. 6: "for a job with priority p, the EWT is the sum of the execution times of jobs with
  higher priority". With several executors serving in parallel, that work drains
  `servers` times faster, and the work of running jobs is ahead of every waiting job.
  The paper computes it for the jobs whose KV it must place (preempted ones); so do we.
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

import numpy as np

from daemon.core.job import Job, KVResidency

_CLASS_STRIDE = 1e9  # request classes are far apart on one sortable axis with the keys


def work_ahead(classes: np.ndarray, keys: np.ndarray, work_s: np.ndarray,
               job_classes: np.ndarray, job_keys: np.ndarray) -> np.ndarray:
    """For each (job_class, job_key): seconds of waiting work of strictly higher priority,
    i.e. a more urgent class, or the same class and a lower key. One sort, O(n log n)."""
    axis = classes * _CLASS_STRIDE + keys
    order = np.argsort(axis, kind="stable")
    before = np.concatenate(([0.0], np.cumsum(work_s[order])))
    at = np.searchsorted(axis[order], job_classes * _CLASS_STRIDE + job_keys, side="left")
    return before[at]


def estimate_waits(ahead_s: np.ndarray, levels: np.ndarray, promote_in_s: np.ndarray | None,
                   servers: int, run_level: float | None, age_threshold_s: float) -> np.ndarray:
    """EWT (s) per job, vectorised.

    ahead_s: work ahead of each job (running jobs' included); levels: their aged priority
    levels now, log2(remaining s) - wait / threshold; promote_in_s: seconds until the core's
    aging promotes each (None: no aging); run_level: the aged level a waiting job must reach
    to take a running job's place (None when nothing runs: only the work ahead counts).
    """
    ewt = ahead_s / max(servers, 1)
    if run_level is not None:
        ewt = np.minimum(ewt, np.maximum(levels - run_level, 0.0) * age_threshold_s)
    if promote_in_s is not None:
        ewt = np.minimum(ewt, np.maximum(promote_in_s, 0.0))
    return ewt


@dataclass(slots=True, frozen=True)
class Holder:
    """A waiting job whose KV was computed before (preempted or sliced)."""

    job: Job
    level: float
    ewt_s: float


def plan_residency(holders: Sequence[Holder], limit_per_executor: int,
                   offload: bool) -> dict[str, KVResidency]:
    """KEEP / OFFLOAD-or-DROP per job id. Queues are whole priority levels, best first;
    EWT orders jobs within one (then priority); each executor keeps `limit_per_executor`."""
    spill = KVResidency.OFFLOAD if offload else KVResidency.DROP
    used: dict[str, int] = {}
    decisions: dict[str, KVResidency] = {}
    for h in sorted(holders, key=lambda h: (math.floor(h.level), h.ewt_s, h.level)):
        where = h.job.executor_name or ""
        if used.get(where, 0) < limit_per_executor:
            used[where] = used.get(where, 0) + 1
            decisions[h.job.job_id] = KVResidency.KEEP
        else:
            decisions[h.job.job_id] = spill
    return decisions
