"""`lengthwise sim`: the real scheduler core and policies on SimExecutors, in virtual time.

Nothing is re-implemented: jobs go through Scheduler.submit exactly as the HTTP layer hands
them over, and SimExecutor runs the fitted cost model on VirtualClockLoop, whose clock jumps
to the next timer instead of sleeping. Prints the same JSON as `bench run`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from bench import costfile, workload
from bench.metrics import RequestResult, summarize, to_json
from daemon.config import AgingConfig, Config, SchedulerConfig, SimConfig
from daemon.core.job import Job, JobStatus, SamplingSpec
from daemon.core.scheduler import Scheduler
from daemon.executors.base import Executor
from daemon.executors.sim import SimExecutor
from daemon.executors.virtualclock import VirtualClockLoop
from policies import registry


class SimOptions(msgspec.Struct, frozen=True, kw_only=True):
    policy: str = "fcfs"
    executors: int = 1
    max_running: int = 4
    sim: SimConfig = msgspec.field(default_factory=SimConfig)
    natural: bool = False  # forced lengths (ignore_eos + max_tokens) unless set
    max_model_len: int = 2048
    promote_after_s: float | None = 60.0  # None: aging off


class _NullQueue(asyncio.Queue):  # type: ignore[type-arg]
    """Nobody streams simulated tokens to a client: drop them instead of piling them up."""

    def put_nowait(self, item: Any) -> None:
        pass


def predictions(requests: Sequence[workload.Request], how: str, seed: int) -> list[float | None]:
    """none | oracle | noisy-oracle[:SIGMA] (truth x lognormal, default sigma 0.5) | DIR."""
    truth = [float(r.output_tokens) for r in requests]
    kind, _, arg = how.partition(":")
    if kind == "none":
        return [None] * len(requests)
    if kind == "oracle":
        return list(truth)
    if kind == "noisy-oracle":
        sigma = float(arg or 0.5)
        noise = np.random.default_rng([seed, 5]).normal(0.0, sigma, len(requests))
        return [max(t * math.exp(z), 1.0) for t, z in zip(truth, noise, strict=True)]
    from predictor.api import PredictInput
    from predictor.loader import load_predictor
    from predictor.records import Message

    model = load_predictor(how)
    inputs = [PredictInput(messages=[Message(m.role, m.content) for m in r.messages],
                           num_prompt_tokens=r.prompt_tokens) for r in requests]
    return [float(p) for p in model.predict(inputs)]


def _job(req: workload.Request, predicted: float | None, opts: SimOptions, now: float) -> Job:
    if opts.natural:
        room = max(opts.max_model_len - req.prompt_tokens - 1, 1)
        sampling = SamplingSpec(max_tokens=room, temperature=0.0)
    else:
        sampling = SamplingSpec(max_tokens=req.output_tokens, temperature=0.0,
                                ignore_eos=True, min_tokens=req.output_tokens)
    # Prompt ids only matter by their count (cost) and as the sim's token-id seed.
    ids = [(req.index * 7 + k) % opts.sim.vocab_size for k in range(req.prompt_tokens)]
    return Job(job_id=f"req-{req.index}", prompt_token_ids=ids, sampling=sampling,
               arrival_time=now, predicted_output_tokens=predicted,
               true_output_tokens=req.output_tokens, outputs=_NullQueue())


def make_config(opts: SimOptions) -> Config:
    aging = AgingConfig(promote_after_s=opts.promote_after_s or 60.0,
                        enabled=opts.promote_after_s is not None)
    return Config(scheduler=SchedulerConfig(policy=opts.policy, max_running=opts.max_running,
                                            max_waiting=10**9, aging=aging), sim=opts.sim)


async def _simulate(requests: Sequence[workload.Request], preds: Sequence[float | None],
                    opts: SimOptions) -> list[RequestResult]:
    config = make_config(opts)
    exs: list[Executor] = [SimExecutor(f"sim{i}", opts.max_running, opts.sim)
                           for i in range(opts.executors)]
    for ex in exs:
        await ex.start()
    sched = Scheduler(exs, registry.create(opts.policy, config), config.scheduler)
    sched.accepting = True
    loop_task = asyncio.create_task(sched.run(), name="scheduler")
    jobs: list[Job] = []
    try:
        for req, pred in zip(requests, preds, strict=True):
            await asyncio.sleep(max(req.arrival_s - sched.now(), 0.0))
            jobs.append(_job(req, pred, opts, sched.now()))
            sched.submit(jobs[-1])
        if not await sched.drain(1e9):
            raise RuntimeError("jobs left after the horizon")
    finally:
        loop_task.cancel()
        await asyncio.gather(loop_task, return_exceptions=True)
        for ex in exs:
            await ex.shutdown()
    return [_result(req, job) for req, job in zip(requests, jobs, strict=True)]


def _result(req: workload.Request, job: Job) -> RequestResult:
    ok = job.status is JobStatus.FINISHED and job.first_token_time is not None
    return RequestResult(
        index=req.index, arrival_s=job.arrival_time, prompt_tokens=req.prompt_tokens,
        output_tokens=job.num_generated_tokens, ok=ok,
        ttft_s=(job.first_token_time or math.nan) - job.arrival_time,
        jct_s=(job.finish_time or math.nan) - job.arrival_time,
        error="" if ok else (job.finish_reason or "failed"))


def simulate(requests: Sequence[workload.Request], preds: Sequence[float | None],
             opts: SimOptions) -> list[RequestResult]:
    """Runs on its own VirtualClockLoop; call from synchronous code."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_simulate(requests, preds, opts))


def load_sim_config(profile: Path | None) -> SimConfig:
    return costfile.load(profile).sim if profile else SimConfig()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lengthwise sim", description=__doc__.split("\n")[0])
    p.add_argument("--policy", default="fcfs", help=f"one of {registry.names()}")
    p.add_argument("--executors", type=int, default=1, help="simulated engines")
    p.add_argument("--max-running", type=int, default=4, help="jobs per engine")
    p.add_argument("--profile", type=Path, help="cost profile JSON (bench/profiles/)")
    p.add_argument("--predictor", default="oracle",
                   help="oracle | noisy-oracle[:SIGMA] | none | predictor DIR")
    p.add_argument("--no-aging", action="store_true", help="turn aging promotion off")
    p.add_argument("--promote-after", type=float, default=60.0, help="aging threshold, s")
    p.add_argument("--natural", action="store_true", help="jobs stop at their true length "
                   "by themselves (no forced max_tokens)")
    p.add_argument("--slo-ttft", type=float, default=None)
    p.add_argument("--slo-tpot", type=float, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--requests-out", type=Path, help="per-request results (JSONL)")
    workload.add_arguments(p)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    requests = workload.build(workload.spec_from_args(args))
    opts = SimOptions(policy=args.policy, executors=args.executors,
                      max_running=args.max_running, sim=load_sim_config(args.profile),
                      natural=args.natural, max_model_len=args.max_model_len,
                      promote_after_s=None if args.no_aging else args.promote_after)
    started = time.perf_counter()
    results = simulate(requests, predictions(requests, args.predictor, args.seed), opts)
    wall = time.perf_counter() - started
    summary = summarize(results, args.slo_ttft, args.slo_tpot)
    if args.requests_out:
        args.requests_out.write_bytes(b"\n".join(msgspec.json.encode(r) for r in results))
    virtual = max((r.finish_s for r in results if r.ok), default=0.0)
    print(f"simulated {virtual:.1f} s of serving in {wall:.1f} s wall", file=sys.stderr)
    print(to_json(summary) if args.json else msgspec.json.format(to_json(summary)))
    return 0 if summary.n_completed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
