"""The core: its inbox loop driven by hand (events in, commands out), then on the simulated
executor: admission, order, abort, preemption, reload, drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio

from daemon.config import SchedulerConfig, SimConfig
from daemon.core.events import Event, Launch, Stop, Stopped, Submitted, Tokens
from daemon.core.job import Job, JobStatus, KVResidency, SamplingSpec, Slo, StopRequest
from daemon.core.lanes import Lane
from daemon.core.policy import DispatchContext, Policy
from daemon.core.ports import NotAccepting, QueueFull, SloUnreachable
from daemon.core.scheduler import Scheduler
from daemon.core.stream import JobEnd, OutputStream
from daemon.executors.sim import SimExecutor
from policies.fcfs import FCFS
from tests.support import learn_forecast_errors, read_to_end

FAST = SimConfig(prefill_base_s=0.0005, prefill_per_token_s=0.0, decode_base_s=0.001,
                 decode_per_seq_s=0.0, decode_per_context_token_s=0.0)


class Harness:
    def __init__(self, scheduler: Scheduler, executor: SimExecutor) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.streams: dict[str, OutputStream] = {}
        self._count = 0

    def job(self, max_tokens: int = 20, priority: int = 0) -> Job:
        self._count += 1
        return Job(job_id=f"j{self._count}", prompt_token_ids=[1, 2, 3, self._count],
                   sampling=SamplingSpec(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=self.scheduler.now(), priority=priority)

    def submit(self, *jobs: Job) -> None:
        for job in jobs:
            self.streams[job.job_id] = stream = OutputStream()
            self.scheduler.submit(job, stream)

    async def outputs(self, job: Job) -> tuple[list[int], JobEnd]:
        deltas, end = await read_to_end(self.streams[job.job_id], 10)
        return [i for delta in deltas for i in delta.token_ids], end


@pytest_asyncio.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    policy = getattr(request, "param", None) or FCFS()
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    executor = SimExecutor("sim0", inbox, FAST)
    await executor.start()
    scheduler = Scheduler([Lane("sim0", executor.commands, 2)], policy,
                          SchedulerConfig(max_running=2, max_waiting=8), inbox)
    scheduler.accepting = True
    tasks = [asyncio.create_task(scheduler.run()), asyncio.create_task(executor.run())]
    yield Harness(scheduler, executor)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await executor.shutdown()


# ---- the loop by hand: events in, commands out ---------------------------------------------


def _core(policy: Policy) -> tuple[Scheduler, asyncio.Queue[Event], asyncio.Queue[object]]:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    commands: asyncio.Queue[object] = asyncio.Queue()
    core = Scheduler([Lane("e0", commands, 1)], policy, SchedulerConfig(max_running=1), inbox)
    core.accepting = True
    return core, inbox, commands


def _step(core: Scheduler, inbox: asyncio.Queue[Event]) -> None:
    """What one turn of the loop does: every event at hand, then a decision round."""
    while not inbox.empty():
        core.handle(inbox.get_nowait())
    core.dispatch()


def _job(job_id: str, max_tokens: int = 3) -> Job:
    return Job(job_id=job_id, prompt_token_ids=[1, 2], arrival_time=0.0,
               sampling=SamplingSpec(max_tokens=max_tokens, ignore_eos=True))


@pytest.mark.asyncio
async def test_the_loop_turns_events_into_commands_and_owns_the_job() -> None:
    core, inbox, commands = _core(FCFS())
    first, second = _job("a"), _job("b")
    stream = OutputStream()
    core.submit(first, stream)
    core.submit(second, OutputStream())
    assert inbox.qsize() == 2 and core.num_jobs == 2  # submit only puts an event
    assert all(isinstance(event, Submitted) for event in inbox._queue)  # type: ignore[attr-defined]
    assert commands.empty()
    _step(core, inbox)
    launch = commands.get_nowait()
    assert isinstance(launch, Launch) and launch.job_id == "a" and launch.max_new_tokens == 3
    assert commands.empty() and [job.job_id for job in core.waiting] == ["b"]  # one slot
    # The executor's reports: one step's tokens, then the end. The core writes the job.
    inbox.put_nowait(Tokens("e0", 1.5, [("a", [7, 8, 9])]))
    inbox.put_nowait(Stopped("e0", "a", "length"))
    _step(core, inbox)
    assert first.generated_token_ids == [7, 8, 9] and first.first_token_time == 1.5
    assert first.status is JobStatus.FINISHED and first.finish_reason == "length"
    assert stream.ended  # the core ended the output stream
    assert isinstance(relaunch := commands.get_nowait(), Launch) and relaunch.job_id == "b"
    core.cancel("b")  # the client left: the running job is asked to stop
    _step(core, inbox)
    assert commands.get_nowait() == Stop("b", StopRequest.ABORT, False)
    inbox.put_nowait(Stopped("e0", "b", None))
    _step(core, inbox)
    assert second.status is JobStatus.ABORTED and core.num_jobs == 0


@pytest.mark.asyncio
async def test_a_stop_from_an_old_dispatch_or_unknown_job_changes_nothing() -> None:
    core, inbox, commands = _core(FCFS())
    job = _job("a", max_tokens=10)
    core.submit(job, OutputStream())
    _step(core, inbox)
    commands.get_nowait()
    inbox.put_nowait(Stopped("e0", "nobody", "stop"))
    inbox.put_nowait(Tokens("e0", 1.0, [("nobody", [1])]))
    _step(core, inbox)
    assert job.status is JobStatus.RUNNING and core.lanes[0].running == {"a": job}
    # Cut early with budget left (an engine went down): back to the queue, relaunched.
    inbox.put_nowait(Tokens("e0", 1.0, [("a", [4])]))
    inbox.put_nowait(Stopped("e0", "a", None))
    _step(core, inbox)
    launch = commands.get_nowait()
    assert isinstance(launch, Launch) and launch.dispatch == 2
    assert launch.generated_token_ids == [4] and launch.max_new_tokens == 9


@pytest.mark.asyncio
async def test_fcfs_admits_at_most_max_running_and_keeps_arrival_order(harness: Harness) -> None:
    jobs = [harness.job(max_tokens=10) for _ in range(6)]
    harness.submit(*jobs)
    while harness.scheduler.num_jobs > len(harness.scheduler.waiting) + 2:
        await asyncio.sleep(0)  # the loop takes the submissions in and launches two
    assert harness.scheduler.num_running == 2 and len(harness.scheduler.waiting) == 4
    results = await asyncio.gather(*(harness.outputs(job) for job in jobs))
    assert all(len(ids) == 10 and end.finish_reason == "length" for ids, end in results)
    starts = [job.first_token_time for job in jobs]
    assert starts == sorted(starts)  # type: ignore[type-var]


@pytest.mark.asyncio
async def test_abort_waiting_and_running_jobs(harness: Harness) -> None:
    running = [harness.job(max_tokens=10_000) for _ in range(2)]
    waiting = harness.job()
    harness.submit(*running, waiting)
    while not all(job.num_generated_tokens for job in running):
        await asyncio.sleep(0.001)
    harness.scheduler.cancel(waiting.job_id)
    harness.scheduler.cancel(running[0].job_id)
    assert (await harness.outputs(waiting))[1].finish_reason == "abort"
    ids, end = await harness.outputs(running[0])
    assert end.finish_reason == "abort" and 0 < len(ids) < 10_000
    assert running[0].status == JobStatus.ABORTED
    assert harness.scheduler.lanes[0].stats.jobs_aborted == 1
    harness.scheduler.cancel(running[1].job_id)


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
    expected, _ = await harness.outputs(reference)  # uninterrupted run
    jobs = [harness.job(max_tokens=40) for _ in range(5)]
    for job in jobs:
        job.prompt_token_ids = list(reference.prompt_token_ids)  # same tokens expected
    harness.submit(*jobs)
    results = await asyncio.gather(*(harness.outputs(job) for job in jobs))
    for job, (ids, end) in zip(jobs, results):
        assert ids == expected and end.finish_reason == "length"
        assert job.generated_token_ids == expected
    stats = harness.scheduler.lanes[0].stats
    assert stats.preemptions + stats.budget_yields > 0
    assert stats.tokens_generated == 40 * 6


@pytest.mark.asyncio
async def test_reconfigure_with_jobs_in_flight_loses_none(harness: Harness) -> None:
    jobs = [harness.job(max_tokens=15) for _ in range(8)]
    harness.submit(*jobs)
    await asyncio.sleep(0.005)
    harness.scheduler.reconfigure(SchedulerConfig(max_running=1), SlicesOfFive())
    results = await asyncio.gather(*(harness.outputs(job) for job in jobs))
    assert [len(ids) for ids, _ in results] == [15] * 8
    assert harness.scheduler.lanes[0].max_running == 1


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
    """The policy's KEEP / OFFLOAD / DROP travels with the Stop command (the vLLM executor
    saves the job's KV to kvstore before its abort on OFFLOAD)."""
    ex = harness.executor
    seen: list[bool] = []
    handle = ex._handle

    def record(command: object) -> None:
        if isinstance(command, Stop) and command.why is StopRequest.PREEMPT:
            seen.append(command.offload)
        handle(command)  # type: ignore[arg-type]

    ex._handle = record  # type: ignore[method-assign]
    jobs = [harness.job(max_tokens=200) for _ in range(3)]
    harness.submit(*jobs[:2])
    await asyncio.sleep(0.02)
    harness.submit(jobs[2])
    await asyncio.gather(*(harness.outputs(job) for job in jobs))
    assert seen and all(seen)
    assert all(job.kv_offloaded is False for job in jobs)  # the sim has no kvstore


# ---- latency objectives --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_objectives_refuse_the_hopeless_then_shed_or_demote_the_late() -> None:
    core, inbox, commands = _core(FCFS())
    now = core.now()
    busy = _job("busy", max_tokens=1000)
    busy.predicted_output_tokens = 800  # ~6 s of 8 ms steps (the prior clock)
    core.submit(busy, OutputStream())
    _step(core, inbox)
    assert isinstance(commands.get_nowait(), Launch)
    hopeless = _job("hopeless")
    hopeless.arrival_time, hopeless.slo = now, Slo(ttft_s=1.0)
    learn_forecast_errors(core.forecast)  # starts came as forecast: it refuses
    with pytest.raises(SloUnreachable) as caught:
        core.submit(hopeless, OutputStream())
    assert caught.value.refusal.reason == "ttft" and caught.value.refusal.retry_after_s > 4
    assert core.num_jobs == 1  # refused before it became a job
    # A wrong prediction lets two through: the running job "ends in 40 ms".
    busy.predicted_output_tokens = 5
    core.lanes[0].work.update(busy)
    shed_me, keep_me = _job("shed"), _job("keep")
    streams = {job.job_id: OutputStream() for job in (shed_me, keep_me)}
    for job in (shed_me, keep_me):
        job.arrival_time, job.predicted_output_tokens = core.now(), 3
        job.slo = Slo(ttft_s=0.3, sheddable=job is shed_me)  # 2 x 0.1 s (COLD_RATIO, floor)
        core.submit(job, streams[job.job_id])
    _step(core, inbox)
    assert keep_me.on_time and core.waiting.rank(keep_me) == 0
    await asyncio.sleep(0.35)  # the running job is still running: both are late
    _step(core, inbox)
    assert shed_me.status is JobStatus.ABORTED and shed_me.finish_reason == "shed"
    _, end = await read_to_end(streams["shed"], 1)
    assert end.dropped == "rejected-ttl-expired" and end.error is not None
    assert keep_me in core.waiting and keep_me.slo_missed and core.waiting.rank(keep_me) == 1


@pytest.mark.asyncio
async def test_shadow_mode_refuses_nothing_and_marks_what_enforcement_refuses() -> None:
    """[slo] enforce = false: the job enforcement refuses (the same state, the same rule) is
    accepted and marked with why; with enforcement back on, the same job is refused."""
    core, inbox, commands = _core(FCFS())
    busy = _job("busy", max_tokens=1000)
    busy.predicted_output_tokens = 800
    core.submit(busy, OutputStream())
    _step(core, inbox)
    assert isinstance(commands.get_nowait(), Launch)
    fits, hopeless = _job("fits"), _job("hopeless")
    fits.slo, hopeless.slo = Slo(ttft_s=60.0), Slo(ttft_s=1.0)
    for job in (fits, hopeless):
        job.arrival_time = core.now()
    core.forecast.enforce = False
    learn_forecast_errors(core.forecast)
    core.submit(fits, OutputStream())
    core.submit(hopeless, OutputStream())
    assert fits.would_refuse is None
    assert hopeless.would_refuse is not None and hopeless.would_refuse.cause == "ttft:queue"
    assert core.num_jobs == 3
    core.forecast.enforce = True
    again = _job("again")
    again.arrival_time, again.slo = core.now(), Slo(ttft_s=1.0)
    with pytest.raises(SloUnreachable):
        core.submit(again, OutputStream())
