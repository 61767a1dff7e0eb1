"""The core on the simulated executor: admission, order, abort, preemption, reload, drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio

from daemon.config import SchedulerConfig, SimConfig
from daemon.core.job import (
    Job,
    JobEnd,
    JobStatus,
    KVResidency,
    SamplingSpec,
    StopRequest,
    TokenDelta,
)
from daemon.core.policy import DispatchContext, Policy
from daemon.core.scheduler import NotAccepting, QueueFull, Scheduler
from daemon.executors.sim import SimExecutor
from policies.fcfs import FCFS

FAST = SimConfig(prefill_base_s=0.0005, prefill_per_token_s=0.0, decode_base_s=0.001,
                 decode_per_seq_s=0.0, decode_per_context_token_s=0.0)


class Harness:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._count = 0

    def job(self, max_tokens: int = 20, priority: int = 0) -> Job:
        self._count += 1
        return Job(job_id=f"j{self._count}", prompt_token_ids=[1, 2, 3, self._count],
                   sampling=SamplingSpec(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=self.scheduler.now(), priority=priority)

    def submit(self, *jobs: Job) -> None:
        for job in jobs:
            self.scheduler.submit(job)


async def outputs(job: Job) -> tuple[list[int], JobEnd]:
    ids: list[int] = []
    while True:
        item = await asyncio.wait_for(job.outputs.get(), 10)
        if isinstance(item, JobEnd):
            return ids, item
        assert isinstance(item, TokenDelta)
        ids.extend(item.token_ids)


@pytest_asyncio.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    policy = getattr(request, "param", None) or FCFS()
    executors = [SimExecutor("sim0", 2, FAST)]
    for ex in executors:
        await ex.start()
    scheduler = Scheduler(executors, policy, SchedulerConfig(max_running=2, max_waiting=8))
    scheduler.accepting = True
    task = asyncio.create_task(scheduler.run())
    yield Harness(scheduler)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for ex in executors:
        await ex.shutdown()


@pytest.mark.asyncio
async def test_fcfs_admits_at_most_max_running_and_keeps_arrival_order(harness: Harness) -> None:
    jobs = [harness.job(max_tokens=10) for _ in range(6)]
    harness.submit(*jobs)
    await asyncio.sleep(0)
    harness.scheduler.dispatch()
    assert harness.scheduler.num_running == 2 and len(harness.scheduler.waiting) == 4
    results = await asyncio.gather(*(outputs(job) for job in jobs))
    assert all(len(ids) == 10 and end.finish_reason == "length" for ids, end in results)
    starts = [job.first_token_time for job in jobs]
    assert starts == sorted(starts)  # type: ignore[type-var]


@pytest.mark.asyncio
async def test_abort_waiting_and_running_jobs(harness: Harness) -> None:
    running = [harness.job(max_tokens=10_000) for _ in range(2)]
    waiting = harness.job()
    harness.submit(*running, waiting)
    while harness.scheduler.num_running < 2:
        await asyncio.sleep(0.001)
    harness.scheduler.abort(waiting)
    harness.scheduler.abort(running[0])
    assert (await outputs(waiting))[1].finish_reason == "abort"
    ids, end = await outputs(running[0])
    assert end.finish_reason == "abort" and 0 < len(ids) < 10_000
    assert running[0].status == JobStatus.ABORTED
    assert harness.scheduler.stats["sim0"].jobs_aborted == 1
    harness.scheduler.abort(running[1])


@pytest.mark.asyncio
async def test_admission_limits(harness: Harness) -> None:
    harness.submit(*(harness.job(max_tokens=10_000) for _ in range(2)))
    while harness.scheduler.num_running < 2:
        await asyncio.sleep(0.001)
    harness.submit(*(harness.job() for _ in range(8)))  # max_waiting = 8
    with pytest.raises(QueueFull):
        harness.submit(harness.job())
    harness.scheduler.accepting = False
    with pytest.raises(NotAccepting):
        harness.submit(harness.job())
    await harness.scheduler.abort_all(timeout_s=5)
    assert harness.scheduler.num_jobs == 0


class EveryJobPreempts(Policy):
    """Test policy: a newer job always replaces the oldest running one, once per job."""

    name = "test-preempt"
    preemptive = True

    def order_key(self, job: Job) -> float:
        return job.arrival_time

    def choose_victim(self, candidate: Job, running: Sequence[Job], now: float) -> Job | None:
        fresh = [job for job in running if job.num_preemptions == 0]
        return fresh[0] if fresh else None


class PreemptsAndOffloads(EveryJobPreempts):
    name = "test-offload"

    def preempt_residency(self, job: Job, ctx: DispatchContext) -> KVResidency:
        return KVResidency.OFFLOAD


class SlicesOfFive(FCFS):
    name = "test-slices"

    def token_budget(self, job: Job) -> int | None:
        return 5


@pytest.mark.asyncio
@pytest.mark.parametrize("harness", [EveryJobPreempts(), SlicesOfFive()], indirect=True)
async def test_tokens_arrive_once_and_in_order_across_stops(harness: Harness) -> None:
    reference = harness.job(max_tokens=40)
    harness.submit(reference)
    expected, _ = await outputs(reference)  # uninterrupted run
    jobs = [harness.job(max_tokens=40) for _ in range(5)]
    for job in jobs:
        job.prompt_token_ids = list(reference.prompt_token_ids)  # same tokens expected
    harness.submit(*jobs)
    results = await asyncio.gather(*(outputs(job) for job in jobs))
    for job, (ids, end) in zip(jobs, results):
        assert ids == expected and end.finish_reason == "length"
        assert job.generated_token_ids == expected
    stats = harness.scheduler.stats["sim0"]
    assert stats.preemptions + stats.budget_yields > 0
    assert stats.tokens_generated == 40 * 6


@pytest.mark.asyncio
async def test_reconfigure_with_jobs_in_flight_loses_none(harness: Harness) -> None:
    jobs = [harness.job(max_tokens=15) for _ in range(8)]
    harness.submit(*jobs)
    await asyncio.sleep(0.005)
    harness.scheduler.reconfigure(SchedulerConfig(max_running=1), SlicesOfFive())
    results = await asyncio.gather(*(outputs(job) for job in jobs))
    assert [len(ids) for ids, _ in results] == [15] * 8
    assert harness.scheduler.executors[0].max_running == 1


@pytest.mark.asyncio
async def test_drain_waits_for_running_jobs(harness: Harness) -> None:
    jobs = [harness.job(max_tokens=30) for _ in range(3)]
    harness.submit(*jobs)
    assert await harness.scheduler.drain(timeout_s=10)
    assert all(job.status == JobStatus.FINISHED for job in jobs)
    assert not harness.scheduler.accepting


@pytest.mark.asyncio
@pytest.mark.parametrize("harness", [PreemptsAndOffloads()], indirect=True)
async def test_the_executor_sees_the_residency_when_asked_to_preempt(harness: Harness) -> None:
    """The policy's KEEP / OFFLOAD / DROP is on the job before the executor stops it (the
    vLLM executor reads it at the abort)."""
    ex = harness.scheduler.executors[0]
    seen: list[KVResidency | None] = []
    stop = ex.request_stop

    def record(job: Job, why: StopRequest) -> None:
        if why is StopRequest.PREEMPT:
            seen.append(job.kv_residency)
        stop(job, why)

    ex.request_stop = record  # type: ignore[method-assign]
    jobs = [harness.job(max_tokens=200) for _ in range(3)]
    harness.submit(*jobs[:2])
    await asyncio.sleep(0.02)
    harness.submit(jobs[2])
    await asyncio.gather(*(outputs(job) for job in jobs))
    assert seen and all(residency is KVResidency.OFFLOAD for residency in seen)
