"""The scheduler core: owns the waiting and running sets and moves jobs between them.

Pure asyncio. It gets its policy from the caller (built from the registry in policies/) and
reaches engines only through the Executor interface. One task (`run`) makes every decision;
submissions and executor stops only change sets and wake it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from daemon.config import SchedulerConfig
from daemon.core.job import Job, JobStatus, StopRequest
from daemon.core.policy import Policy
from daemon.core.waitqueue import WaitQueue
from daemon.executors.base import Executor, Outcome

log = logging.getLogger(__name__)


class NotAccepting(Exception):
    """The daemon is draining or not ready: 503."""


class QueueFull(Exception):
    """Waiting set at scheduler.max_waiting: 429."""


@dataclass(slots=True)
class ExecutorStats:
    """Counters per executor, read by /metrics at scrape time."""

    jobs_started: int = 0  # dispatches, resumes included
    jobs_finished: int = 0
    jobs_aborted: int = 0
    jobs_failed: int = 0
    preemptions: int = 0
    budget_yields: int = 0  # dispatches that ran out of their token budget (slices)
    tokens_generated: int = 0


JobListener = Callable[[Job], None]


class Scheduler:
    def __init__(self, executors: list[Executor], policy: Policy, config: SchedulerConfig) -> None:
        self.executors = executors
        self.policy = policy
        self.config = config
        self.waiting = WaitQueue(policy.order_key, self._promote_after(config))
        self.stats = {ex.name: ExecutorStats() for ex in executors}
        self.on_job_end: list[JobListener] = []  # called once per job that ended
        self.accepting = False
        self._jobs: dict[str, Job] = {}  # every job not yet ended
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop = asyncio.get_running_loop()
        for ex in executors:
            ex.max_running = config.max_running
            ex.on_stop = self._on_executor_stop

    @staticmethod
    def _promote_after(config: SchedulerConfig) -> float | None:
        return config.aging.promote_after_s if config.aging.enabled else None

    def now(self) -> float:
        return self._loop.time()

    @property
    def num_running(self) -> int:
        return sum(len(ex.running) for ex in self.executors)

    @property
    def num_jobs(self) -> int:
        return len(self._jobs)

    # ---- inputs -------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if not self.accepting:
            raise NotAccepting("server is not accepting requests")
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting")
        self._jobs[job.job_id] = job
        self._idle.clear()
        self._enqueue(job)

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
        self.waiting.promote_after_s = self._promote_after(config)
        self.waiting.rekey(policy.order_key)
        for ex in self.executors:
            ex.max_running = config.max_running
        self._wake.set()

    # ---- the decision loop --------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.dispatch()

    def dispatch(self) -> None:
        now = self.now()
        while len(self.waiting):
            free = [ex for ex in self.executors if ex.free_slots > 0]
            if not free:
                break
            job = self.waiting.pop(now)
            assert job is not None
            self._launch(job, self._choose_executor(free))
        self._consider_preemption(now)

    def _choose_executor(self, free: list[Executor]) -> Executor:
        # Least predicted outstanding work; fewer running jobs breaks ties.
        return min(free, key=lambda ex: (ex.load(), len(ex.running)))

    def _launch(self, job: Job, ex: Executor) -> None:
        job.status = JobStatus.RUNNING
        self.stats[ex.name].jobs_started += 1
        ex.launch(job, self.policy.token_budget(job), self.policy.engine_priority(job))

    def _consider_preemption(self, now: float) -> None:
        candidate = self.waiting.peek(now)
        if candidate is None:
            return
        running = [job for ex in self.executors for job in ex.running.values()
                   if job.stop_request is None]
        victim = self.policy.choose_victim(candidate, running)
        if victim is not None and victim.executor_name is not None:
            ex = next(e for e in self.executors if e.name == victim.executor_name)
            ex.request_stop(victim, StopRequest.PREEMPT)

    # ---- executor reports ---------------------------------------------------------------

    def _on_executor_stop(self, job: Job, outcome: Outcome, detail: str | None) -> None:
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
        for listener in self.on_job_end:
            listener(job)
        if not self._jobs:
            self._idle.set()

    # ---- shutdown -----------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting; wait for every job to end. True if all ended in time."""
        self.accepting = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    async def abort_all(self, timeout_s: float = 10.0) -> None:
        for job in list(self._jobs.values()):
            self.abort(job)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("%d jobs did not stop within %.0f s", len(self._jobs), timeout_s)
