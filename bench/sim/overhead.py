"""`lengthwise sim --overhead`: scheduler cost per decision round with ~1,000 jobs waiting.

A burst of `waiting + slots + extra` jobs arrives at t=0; every decision round (the core's
`dispatch`: launches, preemption check, the policy's review/planning) is timed until fewer
than `waiting` jobs wait. Virtual time: only the Python work is measured, but on a shared
machine other processes' load shows up in the wall-time tail.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence

import msgspec
import numpy as np

from bench import workload
from bench.sim.predictions import Estimate
from bench.sim.run import SimOptions, make_job, start_daemon, time_rounds
from daemon.config import slots_per_engine
from daemon.executors.virtualclock import VirtualClockLoop


class Overhead(msgspec.Struct, frozen=True, kw_only=True):
    policy: str
    rounds: int
    mean_us: float  # thread CPU time per round
    p50_us: float
    p99_us: float
    max_us: float
    wall_p50_us: float  # wall time per round (includes being descheduled)
    wall_p99_us: float
    submit_us: float  # mean wall cost of one submit (enqueue) into a 1,000-deep queue


def burst_size(opts: SimOptions, waiting: int = 1000, extra: int = 300) -> int:
    return waiting + opts.executors * slots_per_engine(opts.config) + extra


def measure_overhead(requests: Sequence[workload.Request], preds: Sequence[Estimate],
                     opts: SimOptions, waiting: int = 1000) -> Overhead:
    """requests: at least burst_size(opts, waiting) of them; their arrival times are ignored."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(_measure(requests, preds, opts, waiting))


async def _measure(requests: Sequence[workload.Request], preds: Sequence[Estimate],
                   opts: SimOptions, waiting: int) -> Overhead:
    daemon = await start_daemon(opts)
    sched = daemon.scheduler
    rounds = time_rounds(sched)
    jobs = [make_job(r, p, opts, 0.0) for r, p in zip(requests, preds, strict=True)]
    gc.collect()  # start clean; collections during the run are counted, as in service
    t0 = time.perf_counter()
    for job in jobs:
        daemon.submit(job)
    submit_us = (time.perf_counter() - t0) / len(jobs) * 1e6
    daemon.tasks.append(asyncio.create_task(sched.run()))
    try:  # until the burst was taken in and has drained below `waiting`
        while not sched.inbox.empty() or len(sched.waiting) >= waiting:
            await asyncio.sleep(0.05)
    finally:
        await daemon.stop(abort=True)
    cpu = np.array([c for n, _, c in rounds if n >= waiting]) * 1e6
    wall = np.array([w for n, w, _ in rounds if n >= waiting]) * 1e6
    if not len(cpu):
        raise RuntimeError(f"no decision round ran with {waiting} jobs waiting")
    return Overhead(policy=opts.config.scheduler.policy, rounds=len(cpu),
                    mean_us=float(cpu.mean()), p50_us=float(np.percentile(cpu, 50)),
                    p99_us=float(np.percentile(cpu, 99)), max_us=float(cpu.max()),
                    wall_p50_us=float(np.percentile(wall, 50)),
                    wall_p99_us=float(np.percentile(wall, 99)), submit_us=submit_us)


def overhead_table(rows: Sequence[Overhead]) -> str:
    head = ("| policy | rounds timed | CPU mean µs | CPU p50 µs | CPU p99 µs | CPU max µs "
            "| wall p50 µs | wall p99 µs | submit µs |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r.policy} | {r.rounds} | {r.mean_us:.0f} | {r.p50_us:.0f} "
                     f"| {r.p99_us:.0f} | {r.max_us:.0f} | {r.wall_p50_us:.0f} "
                     f"| {r.wall_p99_us:.0f} | {r.submit_us:.1f} |")
    return "\n".join(lines)
