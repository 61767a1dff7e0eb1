"""SCLS (2024): slice-level scheduling.

- Every dispatch runs at most `slice_tokens` (S, default 128) tokens; an unfinished job
  returns to the pool and is rescheduled with new arrivals (its generated tokens become
  part of its input, re-prefilled on resume, as in the paper).
- At each schedule interval the unplanned jobs of the pool are sorted by input length and
  split into batches by Algorithm 1 (policies.scls_batching.dp_batches), minimising the
  estimated serving time T_serve(N, L_i, S) under the memory estimate (L_i + S) * N <=
  `kv_capacity_tokens` and N <= scheduler.max_running.
- Batches go to executors by max-min (longest batch to the least-loaded executor) and wait
  in that executor's local queue, in order; an executor launches from its own queue as its
  slots free. Load = estimated serving time of the batches queued or running there; a
  job's share leaves the load when its slice ends (the paper subtracts a served batch).
- The interval adapts: T = max(interval_factor * least load, min_interval_s) (Eq. 12).

Adaptations to continuous batching (the paper evaluates static batching, its §7 sketches
this): a batch's jobs launch one by one as slots free rather than as one padded batch, and
an executor whose slots are free and whose local queue is empty triggers planning at once
instead of idling until the interval ends (work-conserving). Request classes are planned
separately, the most urgent first. Pool order (for the core's aging) is arrival order.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import groupby

from daemon.config import Config, SCLSConfig, SimConfig
from daemon.core.costmodel import CostModel
from daemon.core.job import Job, JobStatus
from daemon.core.policy import DispatchContext, ExecutorView, Policy
from policies.scls_batching import dp_batches, max_min_assign, next_interval

_Planned = tuple[Job, int]  # job, its num_dispatches when planned (stale once relaunched)


def input_len(job: Job) -> int:
    return job.num_prompt_tokens + job.num_generated_tokens


class SCLS(Policy):
    name = "scls"

    def __init__(self, params: SCLSConfig | None = None, cost: CostModel | None = None,
                 max_batch: int = 4) -> None:
        self.params = params or SCLSConfig()
        self.cost = cost or CostModel.from_sim(SimConfig())
        self.max_batch = max_batch
        self.interval_s = self.params.min_interval_s
        self._queues: dict[str, deque[_Planned]] = {}
        self._share_s: dict[str, float] = {}  # job id -> its share of its batch's T_serve
        self._next_plan = -math.inf
        self._planned_at = -math.inf  # round (loop time) of the last planning

    @classmethod
    def from_config(cls, config: Config) -> SCLS:
        return cls(config.policies.scls, CostModel.from_sim(config.sim),
                   config.scheduler.max_running)

    def order_key(self, job: Job) -> float:
        return job.arrival_time

    def token_budget(self, job: Job) -> int | None:
        return self.params.slice_tokens

    def serve_s(self, size: int, length: int) -> float:
        return self.cost.batch_serve_s(size, length, self.params.slice_tokens)

    def fits(self, size: int, length: int) -> bool:
        cap = self.params.kv_capacity_tokens
        return size <= self.max_batch and (cap == 0 or (length + self.params.slice_tokens)
                                           * size <= cap)

    # ---- dispatch -----------------------------------------------------------------------

    def next_assignment(self, ctx: DispatchContext) -> tuple[Job, ExecutorView] | None:
        if ctx.now >= self._next_plan:
            self._plan(ctx)
        for attempt in range(2):
            for ex in ctx.free_executors():
                job = self._pop_planned(ex.name, ctx)
                if job is not None:
                    return job, ex
            if attempt or self._planned_at == ctx.now:
                return None
            self._plan(ctx)  # a free executor with nothing queued: plan now, do not idle
        return None

    def after_round(self, ctx: DispatchContext) -> float | None:
        if not len(ctx.waiting):
            return None
        if ctx.now >= self._next_plan:  # no slot was free this round: plan anyway
            self._plan(ctx)
        return self._next_plan

    def _pop_planned(self, name: str, ctx: DispatchContext) -> Job | None:
        queue = self._queues.get(name)
        while queue:
            job, dispatches = queue.popleft()
            if job in ctx.waiting and job.num_dispatches == dispatches:
                return job
        return None

    # ---- planning: batching, offloading, interval -----------------------------------------

    def _plan(self, ctx: DispatchContext) -> None:
        self._planned_at = ctx.now
        for name, queue in self._queues.items():  # drop entries of jobs that left or ran
            self._queues[name] = deque((job, n) for job, n in queue
                                       if job.num_dispatches == n and job in ctx.waiting)
        planned = {job.job_id for queue in self._queues.values() for job, _ in queue}
        fresh = sorted((job for job in ctx.waiting if job.job_id not in planned),
                       key=lambda job: (job.priority, input_len(job)))
        loads = {ex.name: self._load(ex, ctx) for ex in ctx.executors}
        for _, group in groupby(fresh, key=lambda job: job.priority):
            self._plan_class(list(group), loads)
        live = planned | {job.job_id for job in fresh} | {j.job_id for j in ctx.running_jobs()}
        self._share_s = {k: v for k, v in self._share_s.items() if k in live}
        self.interval_s = next_interval(loads, self.params.interval_factor,
                                        self.params.min_interval_s)
        self._next_plan = ctx.now + self.interval_s

    def _plan_class(self, jobs: list[Job], loads: dict[str, float]) -> None:
        lengths = [input_len(job) for job in jobs]
        batches = dp_batches(lengths, self.serve_s, self.fits)
        times = [self.serve_s(len(b), lengths[b[-1]]) for b in batches]
        workers = max_min_assign(times, loads)
        for k in sorted(range(len(batches)), key=lambda k: -times[k]):  # offload order
            loads[workers[k]] += times[k]
            queue = self._queues.setdefault(workers[k], deque())
            for i in batches[k]:
                queue.append((jobs[i], jobs[i].num_dispatches))
                self._share_s[jobs[i].job_id] = times[k] / len(batches[k])

    def _load(self, ex: ExecutorView, ctx: DispatchContext) -> float:
        """Estimated seconds of work queued for or running on one executor."""
        total = 0.0
        for job, n in self._queues.get(ex.name, ()):
            if job.num_dispatches == n and job.status is JobStatus.WAITING:
                total += self._share_s.get(job.job_id, 0.0)
        for job in ex.running.values():
            share = self._share_s.get(job.job_id)
            if share is None:  # launched by aging or before a reload: estimate it
                share = self.serve_s(self.max_batch, input_len(job)) / self.max_batch
            total += share
        return total
