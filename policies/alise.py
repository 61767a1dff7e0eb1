"""ALISE (2024): preemptive priority on estimated remaining *execution time*.

- Remaining time T = T_prefill + T_decode from the fitted cost model (daemon.core.costmodel):
  a waiting job pays the prefill of its prompt plus what it already generated (recompute on
  resume; one token if its KV was offloaded to kvstore), a running one only its decode
  share at the configured batch size.
- Priority queues with virtual aging. The paper's queues are levels of remaining time; here
  a level is log2(T) (continuous: each level halves T) and a waiting job climbs one level
  per `age_threshold_s` seconds. The heap key log2(T) + enqueue_time / θ orders waiting
  jobs exactly by their aged level at any instant (the now/θ term is common to all), so
  aging needs no re-keying. The exact level spacing is a reconstruction: the text has none.
- Misprediction: a job that outlives its prediction has it multiplied by `demote_factor`
  (ALISE doubles it), which drops it to a lower level (a checkpoint at the prediction).
- Re-prediction: every `window_tokens` (and at a demotion) the core is asked to re-predict
  the remaining length with the iterative predictor when one is configured (ELIS's windows;
  not in the ALISE paper); its answer replaces the doubled estimate. Without one the
  request is a no-op and demote-and-double alone corrects the estimate.
- Iteration-level preemption: a waiting job replaces the running job with the most time
  left when that time, net of the victim's resume cost (re-prefill; a reload with
  `offload`, ALISE's swap), exceeds
  (1 + margin) x the candidate's aged time; at most `max_preemptions` per job.
- EWT and KV residency (keep / offload / drop) for jobs holding KV: policies.alise_wait.
  Decided for a job when it is preempted (preempt_residency; OFFLOAD makes the executor
  save its KV to kvstore at the abort, with [kvstore] enabled and `offload` on), and
  reviewed every `review_interval_s` for the waiting ones (advice for placement: the
  blocks themselves cannot move once the abort freed them).
- Dispatch across executors: the one holding the job's kept KV if free, else the one with
  the least estimated remaining time of its running jobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import msgspec
import numpy as np

from daemon.core.costmodel import CostModel
from daemon.core.job import Job, JobStatus, KVResidency
from daemon.core.policy import Checkpoint, DispatchContext, ExecutorView, Policy, class_rank
from policies.alise_wait import Holder, estimate_waits, plan_residency, work_ahead
from policies.common import BENCH_KNOB, NonNegative, Params, Positive, pick_victim

_MIN_TIME_S = 1e-6  # log2 floor
# Tokens a job whose KV was offloaded to kvstore computes when it resumes: vLLM computes
# the last one for its logits (docs/kvstore.md). The copy is not counted: a save + load
# of ~1,000 SmolLM2 tokens took 0.03 s unquantized, 0.06 s INT8, against 0.74-0.76 s to
# prefill them again (bench.kvstore_resume, docs/kvstore.md section 4).
_OFFLOADED_RESUME_TOKENS = 1


class ALISEParams(Params, frozen=True):
    """[policies.alise]: priority on estimated remaining execution time (ALISE)."""

    # Virtual aging: a waiting job's effective remaining time halves (it climbs one priority
    # level) for every this many seconds it waits.
    age_threshold_s: Annotated[float, Positive, BENCH_KNOB] = 30.0
    # Preempt only if victim's remaining time (net of its resume cost) > (1 + margin) x the
    # candidate's aged remaining time.
    margin: Annotated[float, NonNegative, BENCH_KNOB] = 1.0
    # Most times one job may be preempted.
    max_preemptions: Annotated[int, NonNegative, BENCH_KNOB] = 2
    # A job that outlives its prediction has it multiplied by this (ALISE doubles it).
    demote_factor: Annotated[float, msgspec.Meta(gt=1), BENCH_KNOB] = 2.0
    # Preempted jobs per executor whose KV cache may stay on the engine (ALISE's GPU job
    # limit); the rest, by estimated wait time, are offloaded or dropped.
    max_resident_jobs: Annotated[int, NonNegative, BENCH_KNOB] = 4
    # Jobs over the resident limit are offloaded to kvstore (needs [kvstore] enabled), not
    # dropped (recomputed on resume).
    offload: bool = False
    # Seconds between reviews of aged priorities, estimated waits and KV residency when
    # nothing else wakes the scheduler.
    review_interval_s: Annotated[float, Positive, BENCH_KNOB] = 0.5


class ALISE(Policy):
    name = "alise"
    preemptive = True
    params_type = ALISEParams
    params_section = "alise"
    window_tokens = 50  # re-prediction window: the one the shipped iterative model learned

    def __init__(self, params: ALISEParams | None = None, cost: CostModel | None = None,
                 max_running: int = 4) -> None:
        super().__init__(params, cost, max_running)  # batch_hint: jobs decoding together
        self.params = params or ALISEParams()
        self.max_preemptions = self.params.max_preemptions
        self.age_threshold_s = self.params.age_threshold_s
        self._next_review = -math.inf
        self._work_s: dict[str, float] = {}  # waiting job id -> T when it was keyed

    def remaining_s(self, job: Job) -> float:
        context = job.num_context_tokens
        if job.status is JobStatus.RUNNING:
            prefill = 0
        else:
            prefill = _OFFLOADED_RESUME_TOKENS if job.kv_offloaded else context
        return self.cost.job_time_s(prefill, context, job.predicted_remaining_tokens,
                                    self.batch_hint)

    def order_key(self, job: Job) -> float:
        work = self.remaining_s(job)
        self._work_s[job.job_id] = work
        return math.log2(max(work, _MIN_TIME_S)) + job.enqueue_time / self.age_threshold_s

    def engine_priority(self, job: Job) -> int:
        return class_rank(job.priority, self.remaining_s(job) * 1000.0)  # ms within a class

    # ---- misprediction: demote and double ----------------------------------------------

    def next_checkpoint(self, job: Job) -> int | None:
        if job.predicted_output_tokens is None:
            return None
        window = (job.num_generated_tokens // self.window_tokens + 1) * self.window_tokens
        demote = max(math.floor(job.predicted_output_tokens) + 1, job.num_generated_tokens + 1)
        return min(window, demote)

    def on_checkpoint(self, job: Job, now: float) -> Checkpoint:
        predicted = job.predicted_output_tokens
        if predicted is not None:  # outlived it: demote (double it until it is ahead)
            predicted = max(predicted, 1.0)
            while predicted <= job.num_generated_tokens:
                predicted *= self.params.demote_factor
        # re-predict too (a no-op without an iterative predictor)
        return Checkpoint(repredict=True, predicted_output_tokens=predicted)

    # ---- preemption and placement -------------------------------------------------------

    def aged_s(self, job: Job, now: float) -> float:
        """Remaining time as virtual aging sees it: halved per age threshold waited."""
        waited = max(now - job.enqueue_time, 0.0)
        return self.remaining_s(job) * 2.0 ** (-waited / self.age_threshold_s)

    def choose_victim(self, candidate: Job, running: Sequence[Job], now: float) -> Job | None:
        bar = (1.0 + self.params.margin) * self.aged_s(candidate, now)
        return pick_victim(candidate, running, self.remaining_s,
                           lambda _, victim: self._net_gain_s(victim) > bar)

    def _net_gain_s(self, victim: Job) -> float:
        """What preempting `victim` frees, net of what its resume will cost: a re-prefill
        of its context, or with `offload` a reload from kvstore (one token computed; the
        victim may be kept instead, when its blocks most likely are still in the engine)."""
        context = victim.num_context_tokens
        resume = self.cost.prefill_s(_OFFLOADED_RESUME_TOKENS if self.params.offload
                                     else context)
        return self.remaining_s(victim) - resume

    def preempt_residency(self, job: Job, ctx: DispatchContext) -> KVResidency:
        """Algorithm 2 at the moment of preemption: the job keeps its KV on the engine if
        its executor keeps fewer than `max_resident_jobs` preempted jobs' KV, else it is
        offloaded (or dropped). The victim sorts last: it was chosen for having the most
        time left, so it waits longest; the held jobs' blocks cannot move any more."""
        where = job.executor_name
        kept = sum(1 for other in ctx.waiting if other.executor_name == where
                   and other.kv_residency is KVResidency.KEEP and other.num_dispatches)
        if kept < self.params.max_resident_jobs:
            return KVResidency.KEEP
        return KVResidency.OFFLOAD if self.params.offload else KVResidency.DROP

    def own_executor(self, job: Job, free: Sequence[ExecutorView]) -> ExecutorView:
        # Kept or offloaded KV is in that executor's engine (prefix cache or kvstore).
        if job.kv_residency in (KVResidency.KEEP, KVResidency.OFFLOAD):
            for ex in free:
                if ex.name == job.executor_name:
                    return ex
        # Least estimated remaining time of the running jobs: Σ remaining_s over them (all
        # RUNNING: no prefill), from the executor's running totals, O(1) per executor.
        return min(free, key=lambda ex: (self.cost.decode_total_s(
            ex.load(), ex.context_reads(), self.batch_hint), len(ex.running)))

    # ---- review: estimated waits and KV residency ---------------------------------------

    def after_round(self, ctx: DispatchContext) -> float | None:
        if len(self._work_s) > 2 * len(ctx.waiting) + 64:  # forget jobs that left
            self._work_s = {job.job_id: self._work_of(job) for job in ctx.waiting}
        if not len(ctx.waiting):
            return None
        if ctx.now >= self._next_review:
            self._review(ctx)
            self._next_review = ctx.now + self.params.review_interval_s
        return self._next_review  # aged priorities may warrant a preemption by then

    def _review(self, ctx: DispatchContext) -> None:
        """EWT and KV residency for the waiting jobs that hold KV (preempted or sliced);
        one pass over the waiting set, then numpy: it runs with thousands waiting."""
        keyed = ctx.waiting.keyed()
        at = [i for i, (_, _, job) in enumerate(keyed) if job.num_dispatches and job.executor_name]
        if not at:
            return
        cached = self._work_s
        table = np.array([(c, k, cached.get(job.job_id, -1.0)) for c, k, job in keyed], float)
        for i in np.flatnonzero(table[:, 2] < 0).tolist():  # not keyed by us (reload)
            table[i, 2] = self._work_of(keyed[i][2])
        holders = [keyed[i][2] for i in at]
        running = ctx.running_jobs()
        running_s = sum(map(self.remaining_s, running))
        run_level = None
        if running:
            worst = max(self.remaining_s(job) for job in running)
            run_level = math.log2(max(worst, _MIN_TIME_S)) - math.log2(1.0 + self.params.margin)
        mine = table[at]
        ahead = running_s + work_ahead(table[:, 0], table[:, 1], table[:, 2], mine[:, 0],
                                       mine[:, 1])
        levels = mine[:, 1] - ctx.now / self.age_threshold_s
        promote_in = None if ctx.waiting.bound is None else np.array(
            [ctx.waiting.deadline(job) - ctx.now for job in holders])
        ewt = estimate_waits(ahead, levels, promote_in, len(ctx.executors), run_level,
                             self.age_threshold_s).tolist()
        found = [Holder(job, level, wait) for job, level, wait in zip(
            holders, levels.tolist(), ewt, strict=True)]
        plan = plan_residency(found, self.params.max_resident_jobs, self.params.offload)
        for h in found:
            h.job.estimated_wait_s, h.job.kv_residency = h.ewt_s, plan[h.job.job_id]

    def _work_of(self, job: Job) -> float:
        work = self._work_s.get(job.job_id)
        return self.remaining_s(job) if work is None else work
