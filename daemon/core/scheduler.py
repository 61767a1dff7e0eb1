"""The scheduler core: owns the waiting and running sets and moves jobs between them.

Pure asyncio. It gets its policy from the caller (built from the registry in policies/) and
reaches engines only through the Executor interface. One task (`run`) makes every decision;
submissions, executor stops and checkpoints only change sets and wake it. A timer wakes it
too, when the oldest waiting job is due for promotion or the policy asked for a round, so
aging and preemption happen even when no slot frees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from daemon.core import guard
from daemon.core.calibration import LengthCalibration
from daemon.core.job import Job, JobStatus, KVResidency, StopRequest
from daemon.core.policy import DispatchContext, ExecutorView, Policy
from daemon.core.repredict import RemainingPredictor, Repredictor
from daemon.core.settings import SchedulerConfig
from daemon.core.stats import ExecutorStats
from daemon.core.waitqueue import WaitBound, WaitQueue
from daemon.executors.base import Executor, Outcome

log = logging.getLogger(__name__)

_MIN_TIMER_S = 0.001  # a policy asking for a round "now" again must not spin the loop
_TYPICAL_WEIGHT = 0.01  # EWMA weight of one arrival: ~100 jobs of memory


class NotAccepting(Exception):
    """The daemon is draining or not ready: 503."""


class QueueFull(Exception):
    """Waiting set at scheduler.max_waiting: 429."""


JobListener = Callable[[Job], None]
DispatchListener = Callable[[Job, Executor], None]


class Scheduler:
    def __init__(self, executors: list[Executor], policy: Policy, config: SchedulerConfig) -> None:
        self.executors = executors
        self.policy = policy
        self.config = config
        self.waiting = WaitQueue(policy.order_key, self._wait_bound())
        self.stats = {ex.name: ExecutorStats() for ex in executors}
        self.on_job_end: list[JobListener] = []  # called once per job that ended
        self.on_dispatch: list[DispatchListener] = []  # called at every launch and resume
        self.accepting = False
        self._jobs: dict[str, Job] = {}  # every job not yet ended
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop = asyncio.get_running_loop()
        self._by_name = {ex.name: ex for ex in executors}
        self._policy_wakeup: float | None = None
        self.typical_service_s = 0.0  # EWMA of arriving jobs' predicted service time (s)
        self.calibration = LengthCalibration()
        policy.trust_budget = config.trust_budget
        self.repredictor = Repredictor(self._on_reprediction)
        self.repredictor.timeout_s = policy.repredict_timeout_s
        for ex in executors:
            ex.max_running = config.max_running
            ex.on_stop = self._on_executor_stop
            ex.on_up = self._wake.set  # a restarted engine has free slots again

    def _wait_bound(self) -> WaitBound | None:
        """Seconds of total wait each job may accumulate: slowdown x the typical predicted
        service time of arriving jobs, within [min_wait_s, promote_after_s] (AgingConfig).

        Measured in the simulator (docs/policies.md): a bound proportional to each job's
        *own* service time loses to one uniform across jobs on both mean and p99, since
        the tail is made of waits in bursts, not of long service; the uniform bound still
        scales with the workload (seconds for chat answers, minutes for long reports)."""
        aging, policy = self.config.aging, self.policy
        if not (aging.enabled and policy.aged):
            return None
        low, high, k = aging.min_wait_s, aging.promote_after_s, aging.slowdown
        if k <= 0:
            return lambda _: high

        def bound(job: Job) -> float:
            return min(high, max(low, k * (self.typical_service_s or policy.service_s(job))))

        return bound

    def now(self) -> float:
        return self._loop.time()

    @property
    def num_running(self) -> int:
        return sum(len(ex.running) for ex in self.executors)

    @property
    def num_jobs(self) -> int:
        return len(self._jobs)

    @property
    def remaining_predictor(self) -> RemainingPredictor | None:
        """Async callable re-predicting remaining tokens at policy checkpoints (ISRTF)."""
        return self.repredictor.predict

    @remaining_predictor.setter
    def remaining_predictor(self, predict: RemainingPredictor | None) -> None:
        self.repredictor.predict = predict

    # ---- inputs -------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if not self.accepting:
            raise NotAccepting("server is not accepting requests")
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting")
        self._jobs[job.job_id] = job
        self._idle.clear()
        if job.first_prediction is None:
            job.first_prediction = job.predicted_output_tokens
        self._observe_service(job)
        self._enqueue(job)

    def _observe_service(self, job: Job) -> None:
        """Track the typical predicted service time of arriving jobs (EWMA)."""
        service = self.policy.service_s(job)
        if self.typical_service_s <= 0:
            self.typical_service_s = service
        else:
            self.typical_service_s += _TYPICAL_WEIGHT * (service - self.typical_service_s)

    def abort(self, job: Job) -> None:
        """Client went away: end the job wherever it is."""
        if job.is_done:
            return
        if self.waiting.remove(job):
            self._end(job, JobStatus.ABORTED, "abort")
            return
        for ex in self.executors:
            if job.job_id in ex.running:
                ex.request_stop(job, StopRequest.ABORT)

    def reconfigure(self, config: SchedulerConfig, policy: Policy) -> None:
        """Live reload: new limits, aging and policy; waiting jobs are re-ranked, none lost."""
        self.config = config
        self.policy = policy
        policy.length_scale = self.calibration.scale if config.calibrate_lengths else 1.0
        policy.trust_budget = config.trust_budget
        self.repredictor.timeout_s = policy.repredict_timeout_s
        self.waiting.rekey(policy.order_key, self._wait_bound())
        self._policy_wakeup = None
        for ex in self.executors:
            ex.max_running = config.max_running
            for job in ex.running.values():  # running jobs keep going; new checkpoints
                job.checkpoint_tokens = policy.next_checkpoint(job)
        self._wake.set()

    # ---- the decision loop --------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                deadline = self._next_deadline()
                delay = None if deadline is None else max(deadline - self.now(), _MIN_TIMER_S)
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()
                self.dispatch()
        finally:
            await self.repredictor.close()

    def _next_deadline(self) -> float | None:
        due = (self.waiting.promotion_due(), self._policy_wakeup)
        return min((t for t in due if t is not None and t > self.now()), default=None)

    def dispatch(self) -> None:
        """One decision round: launch what fits, preempt what pays, let the policy review."""
        ctx = DispatchContext(self.now(), self.waiting, self.executors)
        self._assign(ctx)
        if self.config.aging.preempt and len(self.waiting):
            self._preempt_for_promoted(ctx)
        if self.policy.preemptive and len(self.waiting):
            self._consider_preemption(ctx)
        self._policy_wakeup = self.policy.after_round(ctx)

    def _assign(self, ctx: DispatchContext) -> None:
        for _ in range(sum(ex.free_slots for ex in self.executors)):
            promoted = self.waiting.oldest_promoted(ctx.now)  # aging beats every policy
            pick: tuple[Job, ExecutorView] | None
            if promoted is not None:
                free = ctx.free_executors()
                pick = (promoted, self.policy.choose_executor(promoted, free)) if free else None
            else:
                pick = self.policy.next_assignment(ctx)
                if pick is not None and self.config.aging.lookahead:
                    pick = self._guard(pick, ctx)
            if pick is None:
                return
            job, view = pick
            job.promoted = job is promoted or job.promoted
            ex = self._by_name.get(view.name)
            if ex is None or ex.free_slots <= 0 or not self.waiting.remove(job):
                log.error("policy %s proposed an invalid dispatch of %s to %s",
                          self.policy.name, job.job_id, view.name)
                return
            self._launch(job, ex)

    def _guard(self, pick: tuple[Job, ExecutorView], ctx: DispatchContext
               ) -> tuple[Job, ExecutorView]:
        """The policy's pick, unless the look-ahead guard (core/guard.py) starts the
        earliest-deadline job instead (then protected from preemption)."""
        slots = sum(ex.max_running for ex in self.executors)
        head = guard.overrule(pick[0], self.waiting, self.policy.service_s,
                              ctx.running_jobs(), slots, ctx.now)
        if head is None:
            return pick
        head.promoted = True
        return head, self.policy.choose_executor(head, ctx.free_executors())

    def _launch(self, job: Job, ex: Executor) -> None:
        job.status = JobStatus.RUNNING
        job.waited_s += self.now() - job.enqueue_time
        job.estimated_wait_s = None
        self.stats[ex.name].jobs_started += 1
        job.on_checkpoint = self._on_checkpoint
        job.checkpoint_tokens = self.policy.next_checkpoint(job)
        budget = self.policy.token_budget(job) if job.resumes_exactly else None  # not sliced
        ex.launch(job, budget, self.policy.engine_priority(job))
        for listener in self.on_dispatch:
            listener(job, ex)

    def _preemptible(self, ctx: DispatchContext, limit: int | None) -> tuple[int, list[Job]]:
        """(running jobs already being preempted, jobs that may still be): never a promoted
        job, one at the preemption bound `limit`, nor one that cannot resume exactly."""
        pending, eligible = 0, []
        for job in ctx.running_jobs():
            if job.stop_request == StopRequest.PREEMPT:
                pending += 1
            elif (job.stop_request is None and not job.promoted and job.resumes_exactly
                  and (limit is None or job.num_preemptions < limit)):
                eligible.append(job)
        return pending, eligible

    def _preempt_for_promoted(self, ctx: DispatchContext) -> None:
        """Jobs past their wait bound that found no free slot each replace the running job
        with the most predicted work left, if that is more than their own: the bound holds
        even when long jobs hold every slot. Slots already being freed are counted."""
        pending, eligible = self._preemptible(ctx, self.policy.max_preemptions)
        if not eligible:
            return
        service = self.policy.service_s
        for candidate in self.waiting.promoted(ctx.now, pending + len(eligible))[pending:]:
            victim = max(eligible, key=service)
            if service(victim) <= service(candidate):
                return
            self._preempt(victim, ctx)
            eligible.remove(victim)
            if not eligible:
                return

    def _consider_preemption(self, ctx: DispatchContext) -> None:
        """Each waiting job in order may replace one running job, as long as the policy
        says it pays; slots already being freed by earlier preemptions are counted. Jobs
        at the policy's preemption bound, or promoted by aging, are never victims."""
        pending, eligible = self._preemptible(ctx, self.policy.max_preemptions)
        if not eligible:
            return
        for candidate in self.waiting.best(ctx.now, pending + len(eligible))[pending:]:
            victim = self.policy.choose_victim(candidate, eligible, ctx.now)
            if victim is None or victim not in eligible:
                return
            eligible.remove(victim)
            self._preempt(victim, ctx)
            if not eligible:
                return

    def _preempt(self, job: Job, ctx: DispatchContext) -> None:
        """Ask the job's executor to stop it, with the policy's word on where its KV
        waits (read by the executor at the abort)."""
        try:
            job.kv_residency = self.policy.preempt_residency(job, ctx)
        except Exception:  # a policy bug costs a recompute, never the preemption
            log.exception("policy %s: residency of %s failed", self.policy.name, job.job_id)
            job.kv_residency = KVResidency.DROP
        self._by_name[job.executor_name or ""].request_stop(job, StopRequest.PREEMPT)

    # ---- checkpoints and re-prediction --------------------------------------------------

    def _on_checkpoint(self, job: Job) -> None:
        """A running job reached its checkpoint (called from its executor's delta)."""
        if job.status is not JobStatus.RUNNING:
            return
        try:
            repredict = self.policy.on_checkpoint(job, self.now())
            mark = self.policy.next_checkpoint(job)
        except Exception:  # a policy bug must not fail the job that is streaming
            log.exception("policy %s: checkpoint of %s failed", self.policy.name, job.job_id)
            return
        job.checkpoint_tokens = mark if mark is None else max(mark, job.num_generated_tokens + 1)
        if repredict:
            self.repredictor.request(job)
        self._wake.set()

    def _on_reprediction(self, job: Job, predicted_total: float) -> None:
        job.set_prediction(predicted_total)
        self.waiting.update(job)  # no-op unless it waits
        self._wake.set()

    # ---- executor reports ---------------------------------------------------------------

    def _on_executor_stop(self, job: Job, outcome: Outcome, detail: str | None) -> None:
        job.checkpoint_tokens = None
        stats = self.stats[job.executor_name or ""]
        stats.tokens_generated += job.num_generated_tokens - job.tokens_at_dispatch
        if outcome is Outcome.YIELDED:
            if job.stop_request == StopRequest.PREEMPT:
                job.num_preemptions += 1
                stats.preemptions += 1
            else:
                stats.budget_yields += 1
            self._enqueue(job)
        elif outcome is Outcome.FINISHED:
            stats.jobs_finished += 1
            self._end(job, JobStatus.FINISHED, detail)
        elif outcome is Outcome.ABORTED:
            stats.jobs_aborted += 1
            self._end(job, JobStatus.ABORTED, "abort")
        else:
            stats.jobs_failed += 1
            self._end(job, JobStatus.FAILED, None, error=detail)
        self._wake.set()

    def _enqueue(self, job: Job) -> None:
        job.status = JobStatus.WAITING
        job.enqueue_time = self.now()
        self.waiting.push(job)
        self._wake.set()

    def _end(self, job: Job, status: JobStatus, reason: str | None,
             error: str | None = None) -> None:
        job.end(status, self.now(), reason, error)
        self._jobs.pop(job.job_id, None)
        if self.config.calibrate_lengths:
            self.calibration.observe(job)
            self.policy.length_scale = self.calibration.scale
        for listener in self.on_job_end:
            try:
                listener(job)
            except Exception:  # metrics or the request log must not stall the core
                log.exception("job-end listener failed for %s", job.job_id)
        if not self._jobs:
            self._idle.set()

    # ---- shutdown -----------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting; wait for every job to end. True if all ended in time."""
        self.accepting = False
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def fail_waiting(self, error: str) -> None:
        """No engine can serve any more: stop accepting, end every waiting job with error."""
        self.accepting = False
        for job in list(self.waiting):
            self.waiting.remove(job)
            self._end(job, JobStatus.FAILED, None, error=error)

    async def abort_all(self, timeout_s: float = 10.0) -> None:
        for job in list(self._jobs.values()):
            self.abort(job)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("%d jobs did not stop within %.0f s", len(self._jobs), timeout_s)
