"""Run workloads through the real core + policies on SimExecutors in virtual time, checking
invariants as they happen (one executor per job at a time, aging order at every dispatch,
nothing streamed after a job's end)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from daemon.config import AgingConfig, Config, PoliciesConfig, SchedulerConfig, SimConfig
from daemon.core.events import Event
from daemon.core.job import Job, SamplingSpec
from daemon.core.lanes import Lane
from daemon.core.repredict import RemainingPredictor
from daemon.core.scheduler import Scheduler
from daemon.core.stream import JobEnd, OutputStream, Position, TokenDelta
from daemon.executors.base import Run
from daemon.executors.sim import SimExecutor, prompt_seed
from daemon.executors.virtualclock import VirtualClockLoop
from daemon.policysetup import make_policy

VOCAB = SimConfig().vocab_size


@dataclass(slots=True)
class Spec:
    """One request of a workload."""

    arrival_s: float
    prompt_tokens: int
    true_tokens: int
    predicted: float | None = None
    priority: int = 0
    max_tokens: int = 4096
    abort_at_s: float | None = None
    seed: int | None = None  # with the default temperature (1.0): a seeded random sample
    ignore_eos: bool = False  # forced length: runs to max_tokens whatever true_tokens says


@dataclass(slots=True)
class Dispatch:
    time: float
    job_id: str
    executor: str
    waited_s: float  # since it last entered the waiting set
    aging_violation: str | None = None
    bound_s: float | None = None  # the total wait aging allowed it (None: aging off)


@dataclass
class Result:
    jobs: list[Job]
    deltas: dict[str, list[TokenDelta]]
    ends: dict[str, list[JobEnd]]
    end_calls: dict[str, int]
    dispatches: list[Dispatch]
    scheduler: Scheduler
    double_admissions: list[str] = field(default_factory=list)
    drained: bool = True
    reloaded_at: float | None = None  # loop time of the reload, if it happened before the end

    def by_finish(self) -> list[str]:
        done = [job for job in self.jobs if job.finish_time is not None]
        return [job.job_id for job in sorted(done, key=lambda j: (j.finish_time, j.job_id))]


def first_dispatch_order(result: Result) -> list[str]:
    """Job ids in the order of their first launch."""
    seen: list[str] = []
    for d in result.dispatches:
        if d.job_id not in seen:
            seen.append(d.job_id)
    return seen


class CheckedSim(SimExecutor):
    """A SimExecutor that records any job launched while another executor runs it."""

    def __init__(self, name: str, inbox: asyncio.Queue[Event], owners: dict[str, str],
                 problems: list[str], engine: SimConfig | None = None) -> None:
        super().__init__(name, inbox, engine or SimConfig())
        self._owners = owners
        self._problems = problems

    def _begin(self, run: Run) -> None:
        owner = self._owners.get(run.job_id)
        if owner is not None:
            self._problems.append(f"{run.job_id} launched on {self.name} while on {owner}")
        self._owners[run.job_id] = self.name
        super()._begin(run)

    def _end_run(self, run: Run, finish_reason: str | None, error: str | None = None,
                 kv_offloaded: bool = False) -> None:
        if self._runs.get(run.job_id) is run:
            self._owners.pop(run.job_id, None)
        super()._end_run(run, finish_reason, error, kv_offloaded)


class RecordingStream(OutputStream):
    """Keeps every delta pushed and every end, as they came (a client reads them merged)."""

    def __init__(self, spec: SamplingSpec) -> None:
        super().__init__(spec.stop, spec.min_tokens)
        self.deltas: list[TokenDelta] = []
        self.ends: list[JobEnd] = []

    def push(self, text: str, token_ids: list[int],
             logprobs: list[Position] | None = None) -> bool:
        if self.ends:
            self.deltas.append(TokenDelta("AFTER-END", []))
        self.deltas.append(TokenDelta(text, list(token_ids), logprobs))
        return super().push(text, token_ids, logprobs)

    def finish(self, finish_reason: str | None, error: str | None = None,
               dropped: str | None = None) -> None:
        self.ends.append(JobEnd(finish_reason, error, dropped=dropped))
        super().finish(finish_reason, error, dropped)


class CheckedScheduler(Scheduler):
    """The core, recording every launch as the aging checks see it."""

    dispatches: list[Dispatch]

    def _launch(self, job: Job, lane: Lane) -> None:
        super()._launch(job, lane)
        self.dispatches.append(_check_dispatch(self, job, lane.name))


def expected_tokens(job: Job, count: int) -> list[int]:
    """The ids SimExecutor generates for positions 0..count-1 of this job."""
    seed = prompt_seed(job.prompt_token_ids)
    return [(seed + 7919 * pos) % VOCAB for pos in range(count)]


def make_config(policy: str, *, max_running: int = 2, promote_after_s: float | None = None,
                policies: PoliciesConfig | None = None, slowdown: float = 0.0,
                preempt: bool = False, lookahead: bool = False,
                overtaking: bool = False, overtake_base: str = "together") -> Config:
    """Aging off unless promote_after_s is given; then absolute only unless slowdown > 0."""
    aging = AgingConfig(promote_after_s=promote_after_s or 60.0,
                        enabled=promote_after_s is not None, slowdown=slowdown,
                        preempt=preempt, lookahead=lookahead, overtaking=overtaking,
                        overtake_base=overtake_base)  # type: ignore[arg-type]
    return Config(scheduler=SchedulerConfig(policy=policy, max_running=max_running,
                                            aging=aging),
                  policies=policies or PoliciesConfig())


def make_job(i: int, spec: Spec) -> Job:
    prompt = [(i * 31 + k) % 1000 + 1 for k in range(spec.prompt_tokens)]
    return Job(job_id=f"j{i:03d}", prompt_token_ids=prompt,
               sampling=SamplingSpec(max_tokens=spec.max_tokens, seed=spec.seed,
                                     ignore_eos=spec.ignore_eos),
               arrival_time=spec.arrival_s,
               priority=spec.priority, predicted_output_tokens=spec.predicted,
               true_output_tokens=spec.true_tokens)


def run(config: Config, specs: Sequence[Spec], *, executors: int = 1,
        reload_at: tuple[float, Config] | None = None,
        predictor: RemainingPredictor | None = None, horizon_s: float = 100_000.0,
        engine: SimConfig | None = None) -> Result:
    """engine: the simulated engine's costs (default: the generic ones, which are also the
    config's cost model, the prior the core's clock starts from)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_run(config, specs, executors, reload_at, predictor, horizon_s,
                               engine))


async def _run(config: Config, specs: Sequence[Spec], executors: int,
               reload_at: tuple[float, Config] | None, predictor: RemainingPredictor | None,
               horizon_s: float, engine: SimConfig | None) -> Result:
    owners: dict[str, str] = {}
    problems: list[str] = []
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    exs = [CheckedSim(f"sim{i}", inbox, owners, problems, engine) for i in range(executors)]
    for ex in exs:
        await ex.start()
    ended: asyncio.Queue[Job] = asyncio.Queue()
    lanes = [Lane(ex.name, ex.commands, config.scheduler.max_running) for ex in exs]
    sched = CheckedScheduler(lanes, make_policy(config), config.scheduler, inbox,
                             remaining=predictor, ended=ended)
    sched.dispatches = []
    sched.accepting = True
    jobs = [make_job(i, spec) for i, spec in enumerate(specs)]
    streams = {job.job_id: RecordingStream(job.sampling) for job in jobs}
    tasks = [asyncio.create_task(sched.run()), asyncio.create_task(_ticker())]
    tasks += [asyncio.create_task(ex.run()) for ex in exs]
    tasks += [asyncio.create_task(_abort_later(sched, job, spec.abort_at_s))
              for job, spec in zip(jobs, specs, strict=True) if spec.abort_at_s is not None]
    reloads: list[float] = []
    if reload_at is not None:
        tasks.append(asyncio.create_task(_reload_later(sched, *reload_at, reloads)))
    try:
        await _feed(sched, jobs, streams)
        drained = await sched.drain(horizon_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ex in exs:
            await ex.shutdown()
    end_calls = {job.job_id: 0 for job in jobs}
    while not ended.empty():
        end_calls[ended.get_nowait().job_id] += 1
    return Result(jobs, {jid: st.deltas for jid, st in streams.items()},
                  {jid: st.ends for jid, st in streams.items()}, end_calls, sched.dispatches,
                  sched, problems, drained, reloads[0] if reloads else None)


def _check_dispatch(sched: Scheduler, job: Job, executor: str) -> Dispatch:
    now = sched.now()
    record = Dispatch(now, job.job_id, executor, now - job.enqueue_time)
    queue = sched.waiting
    if queue.bound is None:
        return record
    record.bound_s = queue.bound(job)
    mine = now - job.waited_s + record.bound_s  # job.waited_s includes the wait just ended
    for other in queue:
        theirs = queue.deadline(other)
        if theirs <= now and not (job.promoted and mine <= theirs + 1e-9):
            record.aging_violation = f"{job.job_id} went before promoted {other.job_id}"
            break
    return record


async def _feed(sched: Scheduler, jobs: Sequence[Job], streams: dict[str, RecordingStream]
                ) -> None:
    loop = asyncio.get_running_loop()
    for job in sorted(jobs, key=lambda j: j.arrival_time):
        if job.arrival_time > loop.time():  # equal arrivals are submitted without a yield
            await asyncio.sleep(job.arrival_time - loop.time())
        job.arrival_time = loop.time()
        sched.submit(job, streams[job.job_id])


async def _abort_later(sched: Scheduler, job: Job, at_s: float) -> None:
    await asyncio.sleep(at_s)
    sched.cancel(job.job_id)


async def _reload_later(sched: Scheduler, at_s: float, config: Config,
                        done: list[float]) -> None:
    await asyncio.sleep(at_s)
    sched.reconfigure(config.scheduler, make_policy(config))
    done.append(sched.now())


async def _ticker() -> None:
    while True:  # keeps virtual time moving, so a stuck job ends in a drain timeout, not a hang
        await asyncio.sleep(10.0)


async def perfect_remaining(jobs: Sequence[Job]) -> list[float]:
    """An iterative predictor that knows the truth (yields to the loop like a real one)."""
    await asyncio.sleep(0)
    return [float(max((job.true_output_tokens or 0) - job.num_generated_tokens, 1))
            for job in jobs]
