"""What an executor's report means for a job: the core's reading of a dispatch's end (the
executor only says what happened; the core decides), and the policy's word at a checkpoint
or a preemption, where a failing policy must not fail the job."""

from __future__ import annotations

import logging
from typing import NamedTuple

from daemon.core.events import Stopped
from daemon.core.job import Job, JobStatus, KVResidency, StopRequest
from daemon.core.lanes import LaneStats
from daemon.core.policy import Checkpoint, DispatchContext, Policy

log = logging.getLogger(__name__)


class Ending(NamedTuple):
    status: JobStatus
    finish_reason: str | None
    error: str | None = None


def of_stop(job: Job, event: Stopped, stats: LaneStats) -> Ending | None:
    """How the dispatch `event` reports ends the job (counted in its lane's `stats`); None
    when it goes back to wait: preempted, out of its token budget (a slice), or its engine
    went down."""
    job.checkpoint_tokens = None
    job.kv_offloaded = event.kv_offloaded
    stats.tokens_generated += job.num_generated_tokens - job.tokens_at_dispatch
    if job.stop_request is StopRequest.ABORT:
        stats.jobs_aborted += 1
        return Ending(JobStatus.ABORTED, "abort")
    if event.error is not None:
        stats.jobs_failed += 1
        return Ending(JobStatus.FAILED, None, event.error)
    if event.finish_reason == "stop" or job.num_remaining_budget_tokens <= 0:
        stats.jobs_finished += 1
        return Ending(JobStatus.FINISHED, event.finish_reason or "length")
    if event.finish_reason == "abort":  # the engine dropped it by itself
        stats.jobs_failed += 1
        return Ending(JobStatus.FAILED, None, "engine aborted the request")
    if not job.resumable:  # cut by an engine failure (it is never preempted)
        stats.jobs_failed += 1
        return Ending(JobStatus.FAILED, None, "the engine failed mid-answer and a "
                      "grammar-constrained answer cannot resume")
    if job.stop_request is StopRequest.PREEMPT:
        job.num_preemptions += 1
        stats.preemptions += 1
    elif event.finish_reason == "length":
        stats.budget_yields += 1
    return None


def residency(job: Job, policy: Policy, ctx: DispatchContext) -> KVResidency:
    """Where the KV of `job`, about to be preempted, waits: the policy's word; DROP if the
    policy failed (logged): a policy bug costs a recompute, never the preemption."""
    try:
        return policy.preempt_residency(job, ctx)
    except Exception:
        log.exception("policy %s: residency of %s failed", policy.name, job.job_id)
        return KVResidency.DROP


def at_checkpoint(job: Job, policy: Policy, now: float) -> Checkpoint | None:
    """The policy's word on a running job at its checkpoint; None when the policy failed
    (logged): a policy bug must not fail the job that is streaming."""
    job.checkpoint_tokens = None
    try:
        return policy.on_checkpoint(job, now)
    except Exception:
        log.exception("policy %s: checkpoint of %s failed", policy.name, job.job_id)
        return None


def set_next_checkpoint(job: Job, policy: Policy) -> bool:
    """Ask the policy when to look at the job again (after at_checkpoint's prediction took
    effect); False when it failed (logged)."""
    try:
        mark = policy.next_checkpoint(job)
    except Exception:
        log.exception("policy %s: checkpoint of %s failed", policy.name, job.job_id)
        return False
    job.checkpoint_tokens = mark if mark is None else max(mark, job.num_generated_tokens + 1)
    return True
