"""The executor interface: the only way the core reaches an engine.

An executor runs admitted jobs, streams their tokens into the job, and reports each stop
back to the core with one callback. The subclass supplies `_generate`; this class owns the
per-job tasks, the outcome of each run and the admission count.

An executor whose engine fails is marked down: it offers no free slot, and its running jobs
are handed back as YIELDED with the tokens they already streamed, so the core re-queues
them and they resume (as after a preemption) once an engine is up. See supervisor.py.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from daemon.core.job import Job, StopRequest
from daemon.core.work import RunningWork

log = logging.getLogger(__name__)


class Outcome(enum.IntEnum):
    FINISHED = 1  # stop condition or max_tokens reached
    YIELDED = 2  # preempted, or its token budget for this dispatch ran out
    ABORTED = 3
    FAILED = 4


OnStop = Callable[[Job, Outcome, str | None], None]  # job, outcome, finish reason or error


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine itself last reported (vLLM's scheduler stats), read by /metrics."""

    num_running_reqs: int = 0  # in the engine's running batch
    num_waiting_reqs: int = 0  # admitted by lengthwise but queued inside the engine
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0-1
    block_size: int = 0  # tokens per KV block
    num_gpu_blocks: int = 0  # KV blocks of the engine's cache (device memory or CPU)


class KVStoreTotals(msgspec.Struct, kw_only=True):
    """An engine's kvstore counters (kvstore.store.StoreCounters, as the connector reports
    them through vLLM's scheduler stats) since the executor started: tokens and bytes."""

    stored_bytes: int = 0  # held now (a gauge)
    saved_tokens: int = 0
    loaded_tokens: int = 0  # loaded into the engine instead of prefilled
    evicted_tokens: int = 0  # dropped from the store to stay within its budget
    load_failed_tokens: int = 0  # planned loads that failed: prefilled again

    def plus(self, other: KVStoreTotals) -> KVStoreTotals:
        """Totals over two engine lifetimes (an engine restart starts from zero); the
        gauge is the later one's."""
        return KVStoreTotals(
            stored_bytes=other.stored_bytes,
            saved_tokens=self.saved_tokens + other.saved_tokens,
            loaded_tokens=self.loaded_tokens + other.loaded_tokens,
            evicted_tokens=self.evicted_tokens + other.evicted_tokens,
            load_failed_tokens=self.load_failed_tokens + other.load_failed_tokens)


@dataclass(slots=True)
class ResumeStats:
    """Resumed dispatches (after a preemption, a slice or an engine failure) whose first
    output the engine reported, and the context tokens they had to prefill again."""

    resumes: int = 0
    context_tokens: int = 0  # prompt + generated tokens of those resumes
    recomputed_tokens: int = 0  # prompt + generated tokens minus the engine's cached ones


class Executor(abc.ABC):
    def __init__(self, name: str, max_running: int) -> None:
        self.name = name
        self.max_running = max_running  # admission cap; the core may change it on reload
        self.running: dict[str, Job] = {}
        # Predicted work of the running jobs, kept in step with them (load(), placement).
        self.work = RunningWork()
        self.on_stop: OnStop = lambda job, outcome, detail: None
        # The engine's own view as it last reported it; None until it did.
        self.reported_stats: EngineStats | None = None
        self.resume_stats = ResumeStats()
        self.offloaded_resume_stats = ResumeStats()  # those of jobs whose KV was offloaded
        self.on_up: Callable[[], None] = lambda: None  # the engine serves again: dispatch
        self.on_down: Callable[[], None] = lambda: None  # marked down: restart it now
        self.down_reason: str | None = None  # why the engine is out of service; None = up
        self._tasks: set[asyncio.Task[None]] = set()
        self._job_tasks: dict[str, asyncio.Task[None]] = {}  # the current run of each job

    @property
    def free_slots(self) -> int:
        if self.down_reason is not None:
            return 0
        return max(self.max_running - len(self.running), 0)

    # ---- engine health (overridden by executors whose engine can die) -------------------

    def engine_problem(self) -> str | None:
        """Why the engine cannot serve now (dead, process gone); None when it looks fine."""
        return None

    def engine_failure(self, exc: BaseException) -> str | None:
        """Why `exc`, raised while generating, means the engine failed (not just one job)."""
        return None

    async def restart_engine(self) -> None:
        """Replace a failed engine with a fresh, warm one; raise if that fails."""
        raise NotImplementedError(f"executor {self.name} cannot restart its engine")

    def mark_down(self, why: str) -> None:
        """Take the engine out of service; its running jobs go back to the core at once."""
        if self.down_reason is not None:
            return
        log.error("executor %s is down: %s; %d running jobs go back to the queue",
                  self.name, why, len(self.running))
        self.down_reason = why
        self.on_down()
        current = asyncio.current_task()
        for job_id, task in list(self._job_tasks.items()):
            if task is current:
                continue  # its own _drive reports it
            del self._job_tasks[job_id]
            job = self._leave(job_id)
            task.cancel()  # no more deltas from the old run; it must not report again
            self.on_stop(job, *self._classify_evicted(job))

    def mark_up(self) -> None:
        log.info("executor %s is up again", self.name)
        self.down_reason = None
        self.on_up()

    @abc.abstractmethod
    async def start(self) -> None:
        """Load and warm the engine; return when it can serve."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine. Jobs must have been stopped before."""

    @abc.abstractmethod
    async def _generate(self, job: Job, max_new_tokens: int, engine_priority: int) -> str | None:
        """Generate up to max_new_tokens more tokens for job, calling job.emit per delta.

        Return the engine's finish reason ("stop" / "length"), or None when it stopped early
        because job.stop_request was set (checked after every delta).
        """

    def launch(self, job: Job, token_budget: int | None, engine_priority: int) -> None:
        """Start (or resume) job; it must fit (free_slots > 0)."""
        assert self.free_slots > 0, "launch without a free slot"
        job.executor_name = self.name
        job.num_dispatches += 1
        job.tokens_at_dispatch = job.num_generated_tokens
        job.stop_request = None
        self.running[job.job_id] = job
        self.work.add(job)
        job.on_work_change = self.work.update
        budget = job.num_remaining_budget_tokens
        if token_budget is not None:
            budget = min(budget, token_budget)
        task = asyncio.create_task(self._drive(job, budget, engine_priority),
                                   name=f"{self.name}:{job.job_id}")
        self._job_tasks[job.job_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def request_stop(self, job: Job, why: StopRequest) -> None:
        """Ask a running job to stop at its next token boundary; abort beats preempt."""
        if job.job_id in self.running and (job.stop_request or 0) < why:
            job.stop_request = why

    async def _drive(self, job: Job, budget: int, engine_priority: int) -> None:
        outcome: Outcome = Outcome.FAILED
        detail: str | None = "internal error"
        try:
            reason = await self._generate(job, budget, engine_priority)
            outcome, detail = self._classify(job, reason)
        except asyncio.CancelledError:
            outcome, detail = Outcome.ABORTED, "abort"
            raise
        except Exception as exc:  # an engine error ends this job, never the daemon
            if (why := self.engine_failure(exc)) is not None:
                self.mark_down(why)
                outcome, detail = self._classify_evicted(job)
            else:
                log.exception("executor %s: job %s failed", self.name, job.job_id)
                outcome, detail = Outcome.FAILED, f"engine error: {exc}"
        finally:
            # An evicted run (mark_down) was reported already and may have been relaunched.
            if self._job_tasks.get(job.job_id) is asyncio.current_task():
                del self._job_tasks[job.job_id]
                if job.job_id in self.running:
                    self._leave(job.job_id)
                self.on_stop(job, outcome, detail)

    def _leave(self, job_id: str) -> Job:
        """Take a job out of the running set and out of the work total."""
        job = self.running.pop(job_id)
        self.work.remove(job)
        if job.on_work_change == self.work.update:
            job.on_work_change = None
        return job

    @staticmethod
    def _classify(job: Job, reason: str | None) -> tuple[Outcome, str | None]:
        if job.stop_request == StopRequest.ABORT:
            return Outcome.ABORTED, "abort"
        if reason == "stop" or job.num_remaining_budget_tokens <= 0:
            return Outcome.FINISHED, reason or "length"
        if reason == "abort":  # the engine dropped it by itself
            return Outcome.FAILED, "engine aborted the request"
        return Outcome.YIELDED, None

    @staticmethod
    def _classify_evicted(job: Job) -> tuple[Outcome, str | None]:
        """A run cut by engine failure: resumable unless it was ending anyway."""
        if job.stop_request == StopRequest.ABORT:
            return Outcome.ABORTED, "abort"
        if job.num_remaining_budget_tokens <= 0:
            return Outcome.FINISHED, "length"
        return Outcome.YIELDED, None

    async def stop_all_tasks(self, timeout_s: float = 5.0) -> None:
        """Cancel job tasks still running (shutdown), bounded in time."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    def engine_stats(self) -> EngineStats | None:
        """What the engine last said about itself (read by /metrics at scrape time)."""
        return self.reported_stats

    def kvstore_totals(self) -> KVStoreTotals | None:
        """The engine's kvstore counters; None where no kvstore serves this executor."""
        return None

    def load(self) -> float:
        """Predicted outstanding work, in tokens, of the jobs admitted here: the running
        total of their predicted_remaining_tokens (daemon.core.work), O(1)."""
        return self.work.tokens

    def context_reads(self) -> float:
        """Context tokens the admitted jobs' predicted remaining decode steps read."""
        return self.work.context_reads
