"""Run workloads through the real core + policies on SimExecutors in virtual time, checking
invariants as they happen (one executor per job at a time, aging order at every dispatch)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from daemon.config import AgingConfig, Config, PoliciesConfig, SchedulerConfig, SimConfig
from daemon.core.job import Job, JobEnd, SamplingSpec, TokenDelta
from daemon.core.repredict import RemainingPredictor
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.executors.sim import SimExecutor, _prompt_seed
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


class CheckedSim(SimExecutor):
    """A SimExecutor that records any job admitted while another executor runs it."""

    def __init__(self, name: str, max_running: int, owners: dict[str, str],
                 problems: list[str]) -> None:
        super().__init__(name, max_running, SimConfig())
        self._owners = owners
        self._problems = problems

    def launch(self, job: Job, token_budget: int | None, engine_priority: int) -> None:
        owner = self._owners.get(job.job_id)
        if owner is not None:
            self._problems.append(f"{job.job_id} launched on {self.name} while on {owner}")
        self._owners[job.job_id] = self.name
        super().launch(job, token_budget, engine_priority)

    async def _drive(self, job: Job, budget: int, engine_priority: int) -> None:
        try:
            await super()._drive(job, budget, engine_priority)
        finally:
            self._owners.pop(job.job_id, None)


def expected_tokens(job: Job, count: int) -> list[int]:
    """The ids SimExecutor generates for positions 0..count-1 of this job."""
    seed = _prompt_seed(job)
    return [(seed + 7919 * pos) % VOCAB for pos in range(count)]


def make_config(policy: str, *, max_running: int = 2, promote_after_s: float | None = None,
                policies: PoliciesConfig | None = None, slowdown: float = 0.0,
                preempt: bool = False, lookahead: bool = False) -> Config:
    """Aging off unless promote_after_s is given; then absolute only unless slowdown > 0."""
    aging = AgingConfig(promote_after_s=promote_after_s or 60.0,
                        enabled=promote_after_s is not None, slowdown=slowdown,
                        preempt=preempt, lookahead=lookahead)
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
        predictor: RemainingPredictor | None = None, horizon_s: float = 100_000.0) -> Result:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_run(config, specs, executors, reload_at, predictor, horizon_s))


async def _run(config: Config, specs: Sequence[Spec], executors: int,
               reload_at: tuple[float, Config] | None, predictor: RemainingPredictor | None,
               horizon_s: float) -> Result:
    owners: dict[str, str] = {}
    problems: list[str] = []
    exs: list[Executor] = [CheckedSim(f"sim{i}", config.scheduler.max_running, owners,
                                      problems) for i in range(executors)]
    for ex in exs:
        await ex.start()
    sched = Scheduler(exs, make_policy(config), config.scheduler)
    sched.remaining_predictor = predictor
    sched.accepting = True
    jobs = [make_job(i, spec) for i, spec in enumerate(specs)]
    end_calls = {job.job_id: 0 for job in jobs}
    dispatches: list[Dispatch] = []
    sched.on_job_end.append(lambda job: end_calls.__setitem__(job.job_id,
                                                              end_calls[job.job_id] + 1))
    sched.on_dispatch.append(lambda job, ex: dispatches.append(_check_dispatch(sched, job, ex)))
    tasks = [asyncio.create_task(sched.run()), asyncio.create_task(_ticker())]
    tasks += [asyncio.create_task(_abort_later(sched, job, spec.abort_at_s))
              for job, spec in zip(jobs, specs, strict=True) if spec.abort_at_s is not None]
    reloads: list[float] = []
    if reload_at is not None:
        tasks.append(asyncio.create_task(_reload_later(sched, *reload_at, reloads)))
    try:
        await _feed(sched, jobs)
        drained = await sched.drain(horizon_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ex in exs:
            await ex.shutdown()
    deltas, ends = _collect_outputs(jobs)
    return Result(jobs, deltas, ends, end_calls, dispatches, sched, problems, drained,
                  reloads[0] if reloads else None)


def _check_dispatch(sched: Scheduler, job: Job, ex: Executor) -> Dispatch:
    now = sched.now()
    record = Dispatch(now, job.job_id, ex.name, now - job.enqueue_time)
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


async def _feed(sched: Scheduler, jobs: Sequence[Job]) -> None:
    loop = asyncio.get_running_loop()
    for job in sorted(jobs, key=lambda j: j.arrival_time):
        if job.arrival_time > loop.time():  # equal arrivals are submitted without a yield
            await asyncio.sleep(job.arrival_time - loop.time())
        job.arrival_time = loop.time()
        sched.submit(job)


async def _abort_later(sched: Scheduler, job: Job, at_s: float) -> None:
    await asyncio.sleep(at_s)
    sched.abort(job)


async def _reload_later(sched: Scheduler, at_s: float, config: Config,
                        done: list[float]) -> None:
    await asyncio.sleep(at_s)
    sched.reconfigure(config.scheduler, make_policy(config))
    done.append(sched.now())


async def _ticker() -> None:
    while True:  # keeps virtual time moving, so a stuck job ends in a drain timeout, not a hang
        await asyncio.sleep(10.0)


def _collect_outputs(jobs: Sequence[Job]) -> tuple[dict[str, list[TokenDelta]],
                                                   dict[str, list[JobEnd]]]:
    deltas: dict[str, list[TokenDelta]] = {job.job_id: [] for job in jobs}
    ends: dict[str, list[JobEnd]] = {job.job_id: [] for job in jobs}
    for job in jobs:
        while not job.outputs.empty():
            item = job.outputs.get_nowait()
            if isinstance(item, JobEnd):
                ends[job.job_id].append(item)
            else:
                if ends[job.job_id]:
                    deltas[job.job_id].append(TokenDelta("AFTER-END", []))
                deltas[job.job_id].append(item)
    return deltas, ends


async def perfect_remaining(jobs: Sequence[Job]) -> list[float]:
    """An iterative predictor that knows the truth (yields to the loop like a real one)."""
    await asyncio.sleep(0)
    return [float(max((job.true_output_tokens or 0) - job.num_generated_tokens, 1))
            for job in jobs]
