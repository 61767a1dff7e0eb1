"""Scheduler overhead per decision round with about 1,000 jobs waiting.

A burst of `waiting + slots + extra` jobs arrives at t=0; every decision round (the core's
`dispatch`: launches, preemption check, the policy's review/planning) is timed in wall
time until fewer than `waiting` jobs wait. Virtual time: only the Python work is measured,
but on a shared machine other processes' load shows up in the tail.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, replace

import numpy as np

from bench.policy_sim.run import SimSetup, _job, _time_rounds, start_scheduler
from bench.policy_sim.workload import Request, WorkloadSpec, make_workload
from daemon.executors.virtualclock import VirtualClockLoop
from daemon.core.costmodel import CostModel


@dataclass(frozen=True, slots=True)
class Overhead:
    policy: str
    rounds: int
    mean_us: float  # thread CPU time per round
    p50_us: float
    p99_us: float
    max_us: float
    wall_p50_us: float  # wall time per round (includes being descheduled)
    wall_p99_us: float
    submit_us: float  # mean wall cost of one submit (enqueue) into a 1,000-deep queue


def measure_overhead(policy: str, setup: SimSetup, spec: WorkloadSpec,
                     waiting: int = 1000, extra: int = 300) -> Overhead:
    burst = replace(spec, num=waiting + setup.executors * setup.max_running + extra)
    requests = [replace(r, arrival_s=0.0) for r in make_workload(
        burst, CostModel.from_sim(setup.sim), setup.executors, setup.max_running)]
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_measure(policy, requests, setup, waiting))


async def _measure(policy: str, requests: list[Request], setup: SimSetup,
                   waiting: int) -> Overhead:
    sched, exs = await start_scheduler(policy, setup)
    sched.accepting = True
    rounds = _time_rounds(sched)
    jobs = [_job(i, r) for i, r in enumerate(requests)]
    gc.collect()  # start clean; collections during the run are counted, as in service
    t0 = time.perf_counter()
    for job in jobs:
        sched.submit(job)
    submit_us = (time.perf_counter() - t0) / len(jobs) * 1e6
    runner = asyncio.create_task(sched.run())
    try:
        while len(sched.waiting) >= waiting:
            await asyncio.sleep(0.05)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await sched.abort_all(1.0)
        for ex in exs:
            await ex.shutdown()
    cpu = np.array([c for n, _, c in rounds if n >= waiting]) * 1e6
    wall = np.array([w for n, w, _ in rounds if n >= waiting]) * 1e6
    return Overhead(policy, len(cpu), float(cpu.mean()), float(np.percentile(cpu, 50)),
                    float(np.percentile(cpu, 99)), float(cpu.max()),
                    float(np.percentile(wall, 50)), float(np.percentile(wall, 99)), submit_us)
