"""One policy, one workload: the real scheduler core and policy on SimExecutors, in virtual
time (VirtualClockLoop: nothing sleeps). Wall time of every decision round is recorded."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.policy_sim.workload import Request
from daemon.config import AgingConfig, Config, PoliciesConfig, SchedulerConfig, SimConfig
from daemon.core.job import Job, JobStatus, SamplingSpec
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.executors.sim import SimExecutor
from daemon.executors.virtualclock import VirtualClockLoop
from policies import registry


@dataclass(frozen=True, slots=True)
class SimSetup:
    executors: int = 1
    max_running: int = 4
    promote_after_s: float | None = 60.0  # None: aging off
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    # Iterative predictor (ISRTF): noise std (log space) of its re-predictions, shrinking as
    # sqrt(1 + generated / window) (ELIS reports its error falling window by window).
    # None: the same noise as the workload's first predictions (conservative).
    iterative_sigma: float | None = None
    seed: int = 0


@dataclass
class Outcome:
    policy: str
    jct_s: np.ndarray
    ttft_s: np.ndarray
    output_tokens: int
    makespan_s: float
    preemptions: int
    budget_yields: int
    repredictions: int
    rounds: list[tuple[int, float, float]]  # (waiting jobs, wall s, thread CPU s) per round
    wall_s: float


class NoisyIterativePredictor:
    """Remaining = truth x exp(N(0, sigma_g)), sigma_g = sigma0 / sqrt(1 + g / window).
    Deterministic per (seed, job, g), and a coroutine: in virtual time it costs nothing."""

    def __init__(self, sigma0: float, window: int, seed: int) -> None:
        self.sigma0, self.window, self.seed = sigma0, window, seed

    async def __call__(self, jobs: Sequence[Job]) -> list[float]:
        return [self._one(job) for job in jobs]

    def _one(self, job: Job) -> float:
        g = job.num_generated_tokens
        left = max((job.true_output_tokens or 0) - g, 1)
        sigma = self.sigma0 / math.sqrt(1.0 + g / self.window)
        digest = hashlib.blake2b(f"{self.seed}/{job.job_id}/{g}".encode(), digest_size=8)
        z = np.random.default_rng(int.from_bytes(digest.digest(), "little")).normal()
        return float(left * math.exp(sigma * z))


def make_config(policy: str, setup: SimSetup) -> Config:
    aging = AgingConfig(promote_after_s=setup.promote_after_s or 60.0,
                        enabled=setup.promote_after_s is not None)
    return Config(scheduler=SchedulerConfig(policy=policy, max_running=setup.max_running,
                                            max_waiting=10**9, aging=aging),
                  policies=setup.policies, sim=setup.sim)


def simulate(policy: str, requests: Sequence[Request], setup: SimSetup) -> Outcome:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_simulate(policy, requests, setup))


async def _simulate(policy: str, requests: Sequence[Request], setup: SimSetup) -> Outcome:
    started = time.perf_counter()
    sched, exs = await start_scheduler(policy, setup)
    sched.remaining_predictor = NoisyIterativePredictor(
        setup.iterative_sigma or 0.0, setup.policies.isrtf.window_tokens, setup.seed)
    sched.accepting = True
    rounds = _time_rounds(sched)
    runner = asyncio.create_task(sched.run())
    jobs = [_job(i, r) for i, r in enumerate(requests)]
    try:
        await _feed(sched, jobs)
        if not await sched.drain(10**7):
            raise RuntimeError(f"{policy}: jobs left after the horizon")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        for ex in exs:
            await ex.shutdown()
    return _outcome(policy, jobs, sched, rounds, time.perf_counter() - started)


async def start_scheduler(policy: str, setup: SimSetup) -> tuple[Scheduler, list[Executor]]:
    """The real core and policy on started SimExecutors (call on a VirtualClockLoop)."""
    config = make_config(policy, setup)
    exs: list[Executor] = [SimExecutor(f"sim{i}", setup.max_running, setup.sim)
                           for i in range(setup.executors)]
    for ex in exs:
        await ex.start()
    return Scheduler(exs, registry.create(policy, config), config.scheduler), exs


def _time_rounds(sched: Scheduler) -> list[tuple[int, float, float]]:
    """Wall and CPU time of every decision round: on a shared machine wall time also counts
    time the process was not running; the thread's CPU time does not (GC is in both)."""
    rounds: list[tuple[int, float, float]] = []
    inner = sched.dispatch

    def timed() -> None:
        waiting = len(sched.waiting)
        t0, c0 = time.perf_counter(), time.thread_time()
        inner()
        rounds.append((waiting, time.perf_counter() - t0, time.thread_time() - c0))

    sched.dispatch = timed  # type: ignore[method-assign]
    return rounds


def _job(i: int, r: Request) -> Job:
    prompt = [(7 * i + k) % 40000 + 1 for k in range(r.prompt_tokens)]
    return Job(job_id=f"r{i:06d}", prompt_token_ids=prompt,
               sampling=SamplingSpec(max_tokens=max(r.output_tokens, 1) + 4096),
               arrival_time=r.arrival_s, predicted_output_tokens=r.predicted_tokens,
               true_output_tokens=r.output_tokens)


async def _feed(sched: Scheduler, jobs: Sequence[Job]) -> None:
    loop = asyncio.get_running_loop()
    for job in jobs:
        if job.arrival_time > loop.time():
            await asyncio.sleep(job.arrival_time - loop.time())
        job.arrival_time = loop.time()
        sched.submit(job)


def _outcome(policy: str, jobs: Sequence[Job], sched: Scheduler,
             rounds: list[tuple[int, float, float]], wall_s: float) -> Outcome:
    done = [j for j in jobs if j.status is JobStatus.FINISHED]
    if len(done) != len(jobs):
        raise RuntimeError(f"{policy}: {len(jobs) - len(done)} jobs did not finish")
    jct = np.array([(j.finish_time or 0.0) - j.arrival_time for j in done])
    ttft = np.array([(j.first_token_time or 0.0) - j.arrival_time for j in done])
    makespan = max(j.finish_time or 0.0 for j in done) - min(j.arrival_time for j in done)
    stats = sched.stats.values()
    return Outcome(policy, jct, ttft, sum(j.num_generated_tokens for j in done), makespan,
                   sum(s.preemptions for s in stats), sum(s.budget_yields for s in stats),
                   sched.repredictor.jobs, rounds, wall_s)
