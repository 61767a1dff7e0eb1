"""One simulated run: the real scheduler core and the real policy on SimExecutors, in
virtual time (VirtualClockLoop: the clock jumps to the next timer instead of sleeping).

Nothing is re-implemented: jobs go through Scheduler.submit exactly as the HTTP layer hands
them over, and SimExecutor runs the options' cost model (a profile's fitted coefficients),
which the policies estimate with too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from bench import workload
from bench.metrics import RequestResult
from bench.sim.predictions import Estimate, iterative_predictor
from bench.sim.router import make_route
from daemon.config import Config
from daemon.core.costmodel import CostModel
from daemon.core.events import Event
from daemon.core.job import Job, JobStatus, SamplingSpec, Slo
from daemon.core.ports import QueueFull, SloUnreachable
from daemon.core.scheduler import Scheduler
from daemon.core.stream import OutputStream, Position
from daemon.executors.settings import SimConfig
from daemon.executors.sim import SimExecutor
from daemon.executors.virtualclock import VirtualClockLoop
from daemon.service import build_core


class SimOptions(msgspec.Struct, frozen=True, kw_only=True):
    config: Config = msgspec.field(default_factory=Config)  # policy, aging, benchmark knobs
    # The simulated engine's costs (a profile's `sim` section); the policies' estimates too.
    sim: SimConfig = msgspec.field(default_factory=SimConfig)
    executors: int = 1
    natural: bool = False  # forced lengths (ignore_eos + max_tokens) unless set
    max_model_len: int = 2048
    # Remaining-length re-predictions for isrtf/alise: "" keeps the policy's own rule,
    # "noisy:SIGMA" is the truth x lognormal noise shrinking with generated tokens.
    iterative: str = ""
    seed: int = 0
    time_rounds: bool = False  # record every decision round's wall and CPU time
    # "" : one daemon runs all executors. Else one daemon per executor behind a router
    # placing each request on arrival by this score (bench/sim/router.py).
    router: str = ""
    # Every request's latency objective (as llm-d's headers send it): the core admits,
    # refuses and sheds by it as the daemon does; a refused request is a failed result.
    slo: Slo | None = None


class SimRun(msgspec.Struct, kw_only=True):
    results: list[RequestResult]
    preemptions: int
    engine_preemptions: int = 0  # the simulated engines' own (recompute when KV runs out)
    budget_yields: int  # dispatches that ran out of their token budget (SCLS slices)
    repredictions: int
    wall_s: float
    cpu_s: float = 0.0  # process CPU time of the run (robust to other processes' load)
    rounds: list[tuple[int, float, float]] = []  # (waiting jobs, wall s, CPU s) per round


class NullStream(OutputStream):
    """Nobody reads simulated tokens: drop them instead of piling them up (no stop strings
    in simulated requests)."""

    def push(self, text: str, token_ids: list[int],
             logprobs: list[Position] | None = None) -> bool:
        return False


@dataclass(slots=True)
class SimDaemon:
    """The real core and policy on started SimExecutors, each running its task."""

    scheduler: Scheduler
    executors: list[SimExecutor]
    tasks: list[asyncio.Task[None]]

    def submit(self, job: Job) -> None:
        self.scheduler.submit(job, NullStream())

    async def stop(self, abort: bool = False) -> None:
        if abort:  # jobs still queued or running (overhead runs stop early)
            await self.scheduler.abort_all(1.0)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for ex in self.executors:
            await ex.shutdown()


def make_job(req: workload.Request, predicted: Estimate, opts: SimOptions,
             now: float) -> Job:
    if opts.natural:
        room = max(opts.max_model_len - req.prompt_tokens - 1, 1)
        sampling = SamplingSpec(max_tokens=room, temperature=0.0)
    else:
        sampling = SamplingSpec(max_tokens=req.output_tokens, temperature=0.0,
                                ignore_eos=True, min_tokens=req.output_tokens)
    # Prompt ids only matter by their count (cost) and as the sim's token-id seed.
    vocab = opts.sim.vocab_size
    ids = [(req.index * 7 + k) % vocab for k in range(req.prompt_tokens)]
    return Job(job_id=f"req-{req.index}", prompt_token_ids=ids, sampling=sampling,
               arrival_time=now, predicted_output_tokens=predicted.tokens,
               predicted_upper_tokens=predicted.upper,
               true_output_tokens=req.output_tokens, slo=opts.slo)


async def start_daemon(opts: SimOptions) -> SimDaemon:
    """The real core and policy on started SimExecutors (call on a VirtualClockLoop); the
    core's loop and the executors' tasks run."""
    config = opts.config
    if not opts.natural:  # forced lengths: max_tokens is the truth, not a hint to trust
        config = msgspec.structs.replace(config, scheduler=msgspec.structs.replace(
            config.scheduler, trust_budget=False))
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    exs = [SimExecutor(f"sim{i}", inbox, opts.sim, config.engine)
           for i in range(opts.executors)]
    for ex in exs:
        await ex.start()
    remaining = iterative_predictor(opts.iterative, config.policies.isrtf.window_tokens,
                                    opts.seed) if opts.iterative else None
    sched = build_core(config, exs, inbox, cost=CostModel.from_sim(opts.sim),
                       remaining=remaining)
    sched.accepting = True
    tasks = [asyncio.create_task(ex.run(), name=f"executor:{ex.name}") for ex in exs]
    return SimDaemon(sched, exs, tasks)


def time_rounds(sched: Scheduler, rounds: list[tuple[int, float, float]] | None = None
                ) -> list[tuple[int, float, float]]:
    """Wall and CPU time of every decision round: on a shared machine wall time also counts
    time the process was not running; the thread's CPU time does not (GC is in both)."""
    rounds = [] if rounds is None else rounds
    inner = sched.dispatch

    def timed() -> None:
        waiting = len(sched.waiting)
        t0, c0 = time.perf_counter(), time.thread_time()
        inner()
        rounds.append((waiting, time.perf_counter() - t0, time.thread_time() - c0))

    sched.dispatch = timed  # type: ignore[method-assign]
    return rounds


async def _simulate(requests: Sequence[workload.Request], preds: Sequence[Estimate],
                    opts: SimOptions) -> SimRun:
    started, cpu = time.perf_counter(), time.process_time()
    each = msgspec.structs.replace(opts, executors=1) if opts.router else opts
    daemons = [await start_daemon(each) for _ in range(opts.executors if opts.router else 1)]
    scheds = [daemon.scheduler for daemon in daemons]
    rounds: list[tuple[int, float, float]] = []
    for sched in scheds if opts.time_rounds else []:
        time_rounds(sched, rounds)
    route = make_route(opts.router, scheds)
    for daemon in daemons:
        daemon.tasks.append(asyncio.create_task(daemon.scheduler.run(), name="core"))
    jobs: list[Job] = []
    refused: dict[str, str] = {}  # job id -> why (the 429's reason)
    try:
        for req, pred in zip(requests, preds, strict=True):
            await asyncio.sleep(max(req.arrival_s - scheds[0].now(), 0.0))
            jobs.append(make_job(req, pred, opts, scheds[0].now()))
            try:
                route(jobs[-1]).submit(jobs[-1], NullStream())
            except SloUnreachable as exc:
                refused[jobs[-1].job_id] = f"refused: {exc.refusal.reason}"
            except QueueFull:
                refused[jobs[-1].job_id] = "refused: queue full"
        if not all(await asyncio.gather(*(sched.drain(1e9) for sched in scheds))):
            raise RuntimeError("jobs left after the horizon")
    finally:
        for daemon in daemons:
            await daemon.stop()
    stats = [lane.stats for sched in scheds for lane in sched.lanes]
    return SimRun(results=[_result(req, job, refused.get(job.job_id))
                           for req, job in zip(requests, jobs, strict=True)],
                  preemptions=sum(s.preemptions for s in stats),
                  engine_preemptions=sum(ex.engine_preemptions for daemon in daemons
                                         for ex in daemon.executors),
                  budget_yields=sum(s.budget_yields for s in stats),
                  repredictions=sum(sched.repredictor.jobs for sched in scheds),
                  wall_s=time.perf_counter() - started,
                  cpu_s=time.process_time() - cpu, rounds=rounds)


def _result(req: workload.Request, job: Job, refused: str | None = None) -> RequestResult:
    if refused is not None:
        return RequestResult(index=req.index, arrival_s=job.arrival_time,
                             prompt_tokens=req.prompt_tokens, output_tokens=0, ok=False,
                             error=refused)
    ok = job.status is JobStatus.FINISHED and job.first_token_time is not None
    return RequestResult(
        index=req.index, arrival_s=job.arrival_time, prompt_tokens=req.prompt_tokens,
        output_tokens=job.num_generated_tokens, ok=ok,
        ttft_s=(job.first_token_time or math.nan) - job.arrival_time,
        jct_s=(job.finish_time or math.nan) - job.arrival_time,
        error="" if ok else (job.finish_reason or "failed"))


def simulate(requests: Sequence[workload.Request], preds: Sequence[Estimate],
             opts: SimOptions) -> SimRun:
    """Runs on its own VirtualClockLoop; call from synchronous code."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_simulate(requests, preds, opts))
