"""SCLS (2024): slice-level scheduling, adapted to a continuous-batching engine.

- Slices: a dispatch runs at most `slice_tokens` (S, default 128) tokens; an unfinished job
  returns to the pool and is rescheduled with new arrivals (its generated tokens become
  part of its input, re-prefilled on resume, as in the paper). By default (`slicing =
  "auto"`) only under a memory bound (`kv_capacity_tokens` > 0), where a slice caps each
  job's KV so the batch estimate below holds: on a continuous-batching engine slices
  otherwise add re-prefills and waits and lose to FCFS (measured: docs/policies.md).
- At each schedule interval (and whenever a slot is free with nothing planned for it) the
  oldest unplanned jobs, as many as there are free slots, are sorted by input length and
  split into batches by Algorithm 1 (policies.scls_batching.dp_batches), minimising the
  estimated serving time T_serve(N, L_i, S) under the memory estimate (L_i + S) * N <=
  `kv_capacity_tokens` and N <= scheduler.max_running.
- Batches go to executors by max-min (longest batch to the least-loaded executor) and wait
  in that executor's local queue. Load = estimated serving time of the batches queued or
  running there; a job's share leaves the load when its slice ends (the paper subtracts a
  served batch).
- The interval adapts: T = max(interval_factor * least load, min_interval_s) (Eq. 12).

Adaptations to continuous batching (the paper evaluates static batching, its §7 sketches
this): a batch decides where its jobs run, not when: they launch one by one as slots free,
and each executor's local queue is in arrival order (no padding to save, so reordering by
input length would only trade FCFS's tail for nothing). An executor with free slots and an
empty local queue triggers planning at once instead of idling until the interval ends, and
if still nothing is planned for it, takes the oldest job planned for a busy executor
(work-conserving). Request classes are planned separately, the most urgent first. Pool
order (for the core's aging) is arrival order. On one executor without a memory bound this
is FCFS.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from itertools import groupby
from typing import Annotated, Literal

import msgspec

from daemon.core.costmodel import CostModel
from daemon.core.job import Job, JobStatus
from daemon.core.policy import DispatchContext, ExecutorView, Policy
from policies.common import BENCH_KNOB, NonNegative, Params, Positive
from policies.scls_batching import dp_batches, max_min_assign, next_interval

_Planned = tuple[Job, int]  # job, its num_dispatches when planned (stale once relaunched)


class SCLSParams(Params, frozen=True):
    """[policies.scls]: slice-level scheduling (SCLS)."""

    # Most tokens one dispatch runs before the job returns to the pool (the slice S).
    slice_tokens: Annotated[int, msgspec.Meta(ge=1), BENCH_KNOB] = 128
    # When dispatches are cut into slices. "auto": only under a memory bound
    # (kv_capacity_tokens > 0), where a slice caps each job's KV growth; on a continuous-
    # batching engine slices otherwise only add re-prefills and waits (docs/policies.md has
    # the figures). "always": the paper's rule. "never": whole jobs.
    slicing: Annotated[Literal["auto", "always", "never"], BENCH_KNOB] = "auto"
    # The schedule interval T = max(interval_factor x least executor load, min_interval_s).
    min_interval_s: Annotated[float, Positive, BENCH_KNOB] = 0.5
    interval_factor: Annotated[float, msgspec.Meta(gt=0, le=1), BENCH_KNOB] = 0.5
    # Memory estimate per executor, in KV tokens: a batch needs (input + slice) x size of
    # them. 0 = no memory bound beyond scheduler.max_running.
    kv_capacity_tokens: Annotated[int, NonNegative, BENCH_KNOB] = 0

    @property
    def sliced(self) -> bool:
        return self.slicing == "always" or (self.slicing == "auto"
                                            and self.kv_capacity_tokens > 0)


def input_len(job: Job) -> int:
    return job.num_context_tokens


def _arrival(job: Job) -> tuple[int, float]:
    return job.priority, job.arrival_time


class SCLS(Policy):
    name = "scls"
    params_type = SCLSParams
    params_section = "scls"

    def __init__(self, params: SCLSParams | None = None, cost: CostModel | None = None,
                 max_running: int = 4) -> None:
        super().__init__(params, cost, max_running)
        self.params = params or SCLSParams()
        self.max_batch = max_running
        self.interval_s = self.params.min_interval_s
        self._queues: dict[str, deque[_Planned]] = {}
        self._share_s: dict[str, float] = {}  # job id -> its share of its batch's T_serve
        self._next_plan = -math.inf
        self._planned_at = -math.inf  # round (loop time) of the last planning

    def order_key(self, job: Job) -> float:
        return job.arrival_time

    def token_budget(self, job: Job) -> int | None:
        return self.params.slice_tokens if self.params.sliced else None

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
                break
            self._plan(ctx)  # a free executor with nothing queued: plan now, do not idle
        return self._steal(ctx)

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

    def _steal(self, ctx: DispatchContext) -> tuple[Job, ExecutorView] | None:
        """A free executor with nothing planned takes the oldest job planned for a busy one:
        the plan's balance is an estimate, an idle slot beside a queue is a certain loss."""
        free = ctx.free_executors()
        oldest: tuple[str, _Planned] | None = None
        for name, queue in self._queues.items() if free else ():
            entry = next((e for e in queue if e[0].num_dispatches == e[1]
                          and e[0] in ctx.waiting), None)  # queues are in arrival order
            if entry is not None and (oldest is None or _arrival(entry[0]) < _arrival(oldest[1][0])):
                oldest = name, entry
        if oldest is None:
            return None
        self._queues[oldest[0]].remove(oldest[1])
        return oldest[1][0], min(free, key=lambda ex: len(ex.running))

    # ---- planning: batching, offloading, interval -----------------------------------------

    def _plan(self, ctx: DispatchContext) -> None:
        self._planned_at = ctx.now
        for name, queue in self._queues.items():  # drop entries of jobs that left or ran
            self._queues[name] = deque((job, n) for job, n in queue
                                       if job.num_dispatches == n and job in ctx.waiting)
        planned = {job.job_id for queue in self._queues.values() for job, _ in queue}
        # Plan only the oldest jobs that can start now: a continuous-batching engine takes a
        # job whenever a slot frees, so binding more of the pool to executors early only
        # makes jobs wait behind a busy one while another frees (measured: docs/policies.md).
        room = max(sum(ex.free_slots for ex in ctx.executors) - len(planned), 0)
        unplanned = heapq.nsmallest(room, (job for job in ctx.waiting
                                           if job.job_id not in planned), key=_arrival)
        fresh = sorted(unplanned, key=lambda job: (job.priority, input_len(job)))
        loads = {ex.name: self._load(ex, ctx) for ex in ctx.executors}
        for _, group in groupby(fresh, key=lambda job: job.priority):
            self._plan_class(list(group), loads)
        for name, queue in self._queues.items():
            # Batches decide where jobs run; on a continuous-batching engine they launch one
            # by one as slots free, so each executor takes its jobs in arrival order.
            self._queues[name] = deque(sorted(queue, key=lambda e: _arrival(e[0])))
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
