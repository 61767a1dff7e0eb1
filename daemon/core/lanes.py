"""The core's record of each executor (a lane): its command queue, the jobs it runs, their
predicted work, whether its engine serves, and its counters. Only the core's loop changes a
lane; policies read lanes as ExecutorViews, /metrics reads the counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from daemon.core.events import Command
from daemon.core.job import Job
from daemon.core.work import RunningWork


class CommandQueue(Protocol):
    """An executor's command queue as the core sees it: it only puts."""

    def put_nowait(self, item: Command) -> None: ...


@dataclass(slots=True)
class LaneStats:
    """Counters per executor, read by /metrics at scrape time."""

    jobs_started: int = 0  # dispatches, resumes included
    jobs_finished: int = 0
    jobs_aborted: int = 0
    jobs_failed: int = 0
    preemptions: int = 0
    budget_yields: int = 0  # dispatches that ran out of their token budget (slices)
    tokens_generated: int = 0


@dataclass(slots=True)
class ResumeStats:
    """Resumed dispatches (after a preemption, a slice or an engine failure) whose first
    output the engine reported, and the context tokens they had to prefill again."""

    resumes: int = 0
    context_tokens: int = 0  # prompt + generated tokens of those resumes
    recomputed_tokens: int = 0  # prompt + generated tokens minus the engine's cached ones

    def add(self, context_tokens: int, cached_tokens: int) -> None:
        self.resumes += 1
        self.context_tokens += context_tokens
        self.recomputed_tokens += max(context_tokens - cached_tokens, 0)


@dataclass(slots=True, eq=False)
class Lane:
    name: str
    commands: CommandQueue  # the executor's inbox
    max_running: int  # admission cap (scheduler.max_running; changes on reload)
    running: dict[str, Job] = field(default_factory=dict)  # launched, not yet stopped
    # Predicted work of the running jobs, kept in step with them (load(), placement).
    work: RunningWork = field(default_factory=RunningWork)
    down_reason: str | None = None  # why its engine does not serve now; None = up
    failed: bool = False  # its engine could not be restarted: down for good
    stats: LaneStats = field(default_factory=LaneStats)
    resumes: ResumeStats = field(default_factory=ResumeStats)
    offloaded_resumes: ResumeStats = field(default_factory=ResumeStats)  # KV from kvstore

    @property
    def free_slots(self) -> int:
        if self.down_reason is not None:
            return 0
        return max(self.max_running - len(self.running), 0)

    def load(self) -> float:
        """Predicted outstanding work, in tokens, of the jobs admitted here: the running
        total of their predicted_remaining_tokens (daemon.core.work), O(1)."""
        return self.work.tokens

    def context_reads(self) -> float:
        """Context tokens the admitted jobs' predicted remaining decode steps read."""
        return self.work.context_reads

    def admit(self, job: Job) -> None:
        self.running[job.job_id] = job
        self.work.add(job)

    def release(self, job_id: str) -> Job | None:
        """Take a job out (it stopped); None if it is not here (a stale report)."""
        job = self.running.pop(job_id, None)
        if job is not None:
            self.work.remove(job)
        return job
