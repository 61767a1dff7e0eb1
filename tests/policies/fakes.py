"""Hand-made jobs and executors for unit tests of policy decisions (no loop needed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from daemon.core.job import Job, JobStatus, SamplingSpec
from daemon.core.policy import DispatchContext, Policy
from daemon.core.waitqueue import WaitQueue
from daemon.core.work import job_work


def job(jid: str, *, prompt: int = 10, predicted: float | None = 100.0, generated: int = 0,
        priority: int = 0, true: int | None = None, status: JobStatus = JobStatus.WAITING,
        enqueue: float = 0.0, max_tokens: int = 4096, executor: str | None = None,
        dispatches: int = 0) -> Job:
    j = Job(job_id=jid, prompt_token_ids=[1] * prompt,
            sampling=SamplingSpec(max_tokens=max_tokens), arrival_time=enqueue,
            priority=priority, predicted_output_tokens=predicted, true_output_tokens=true)
    j.generated_token_ids = [7] * generated
    j.status, j.enqueue_time = status, enqueue
    j.executor_name, j.num_dispatches = executor, dispatches
    return j


@dataclass
class FakeExecutor:
    name: str
    max_running: int = 2
    running: dict[str, Job] = field(default_factory=dict)

    @property
    def free_slots(self) -> int:
        return max(self.max_running - len(self.running), 0)

    def load(self) -> float:  # recomputed: tests change `running` directly
        return sum(j.predicted_remaining_tokens for j in self.running.values())

    def context_reads(self) -> float:
        return sum(job_work(j)[1] for j in self.running.values())

    def admit(self, *jobs: Job) -> FakeExecutor:
        for j in jobs:
            j.status, j.executor_name = JobStatus.RUNNING, self.name
            self.running[j.job_id] = j
        return self


def work_vs_queue_pair() -> tuple[FakeExecutor, FakeExecutor]:
    """'a' runs one long job, 'b' two short ones: predicted work and queue length disagree."""
    a = FakeExecutor("a", max_running=4).admit(job("x", predicted=900.0))
    b = FakeExecutor("b", max_running=4).admit(job("y", predicted=50.0),
                                               job("z", predicted=60.0))
    return a, b


def context(policy: Policy, waiting: list[Job], executors: list[FakeExecutor],
            now: float = 0.0, promote_after_s: float | None = None) -> DispatchContext:
    queue = WaitQueue(policy.order_key,
                      None if promote_after_s is None else lambda _: promote_after_s)
    for j in waiting:
        queue.push(j)
    return DispatchContext(now, queue, executors)
