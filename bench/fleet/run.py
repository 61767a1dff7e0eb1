"""One fleet simulation per (size, placement), and the per-executor capacity they are scaled
from. Virtual time: the dispatcher's own cost does not slow the simulated fleet, so it is
measured instead (CPU time of every decision round, as a share of simulated time)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from bench import workload
from bench.metrics import RequestResult, Summary, summarize
from bench.sim.predictions import Estimate
from bench.sim.run import SimOptions, simulate
from daemon.config import Config


class FleetPoint(msgspec.Struct, kw_only=True):
    executors: int
    # central: one daemon's core places jobs on its executors as slots free ([scheduler]
    # placement); router: one daemon per executor, a router places each job on arrival.
    binding: str
    placement: str
    offered_rps: float  # the arrival rate the trace was rescaled to
    summary: Summary  # its throughputs are over the makespan, drain included
    steady_rps: float  # completions per second from 25 % to 100 % of the arrival span
    steady_tps: float  # their output tokens per second
    # Arrivals per second in that same window: what steady_rps should match if the fleet
    # keeps up (a trace's rate varies along it, so it is not always offered_rps).
    window_arrival_rps: float = math.nan
    virtual_s: float  # simulated seconds: first arrival to last completion
    wall_s: float  # the simulation's wall time, in its worker
    cpu_s: float  # its CPU time: core, policy, executors' token path, simulated engines
    rounds: int  # decision rounds (Scheduler.dispatch calls)
    round_cpu_mean_us: float  # thread CPU time per round
    round_cpu_p99_us: float
    dispatcher_busy: float  # CPU s of decision rounds per simulated s, per daemon

    @property
    def label(self) -> str:
        return f"{self.binding}:{self.placement}"

    @property
    def daemons(self) -> int:
        return self.executors if self.binding == "router" else 1

    @property
    def cpu_per_virtual_s(self) -> float:
        """Simulation CPU s per simulated s, per daemon."""
        return self.cpu_s / self.virtual_s / self.daemons if self.virtual_s else float("nan")


def with_placement(config: Config, placement: str) -> Config:
    scheduler = msgspec.structs.replace(config.scheduler, placement=placement)
    return msgspec.structs.replace(config, scheduler=scheduler)


def run_point(binding: str, placement: str, offered_rps: float,
              requests: Sequence[workload.Request], preds: Sequence[Estimate],
              opts: SimOptions) -> FleetPoint:
    """One size under one placement (a module-level function: run in a process pool)."""
    if binding == "router":
        opts = msgspec.structs.replace(opts, router=placement, time_rounds=True)
    else:
        opts = msgspec.structs.replace(opts, config=with_placement(opts.config, placement),
                                       time_rounds=True)
    daemons = opts.executors if opts.router else 1
    run = simulate(requests, preds, opts)
    done = [r for r in run.results if r.ok]
    virtual = max((r.arrival_s + r.jct_s for r in done), default=0.0) - min(
        (r.arrival_s for r in run.results), default=0.0)
    cpu = np.array([c for _, _, c in run.rounds]) * 1e6
    rps, tps = steady_throughput(run.results)
    arrivals = window_arrival_rps([r.arrival_s for r in run.results])
    return FleetPoint(
        executors=opts.executors, binding=binding, placement=placement,
        offered_rps=offered_rps,
        summary=summarize(run.results), steady_rps=rps, steady_tps=tps,
        window_arrival_rps=arrivals,
        virtual_s=virtual, wall_s=run.wall_s, cpu_s=run.cpu_s,
        rounds=len(cpu), round_cpu_mean_us=float(cpu.mean()) if len(cpu) else 0.0,
        round_cpu_p99_us=float(np.percentile(cpu, 99)) if len(cpu) else 0.0,
        dispatcher_busy=float(cpu.sum()) / 1e6 / virtual / daemons if virtual else 0.0)


def steady_window(arrivals: Sequence[float], warmup: float = 0.25) -> tuple[float, float]:
    """(start, end) of the steady window: from `warmup` of the arrival span to its end."""
    end = max(arrivals)
    return warmup * end, end


def steady_throughput(results: Sequence[RequestResult], warmup: float = 0.25
                      ) -> tuple[float, float]:
    """(req/s, output tok/s) of the jobs that finish while requests still arrive, after the
    first `warmup` of the arrival span: a finite run's makespan throughput also counts the
    fill at the start and the drain at the end, which weigh more the fewer requests run."""
    start, end = steady_window([r.arrival_s for r in results], warmup)
    done = [r for r in results if r.ok and start <= r.arrival_s + r.jct_s <= end]
    span = end - start
    if span <= 0:
        return math.nan, math.nan
    return len(done) / span, sum(r.output_tokens for r in done) / span


def window_arrival_rps(arrivals: Sequence[float], warmup: float = 0.25) -> float:
    """Arrivals per second in steady_throughput's window."""
    start, end = steady_window(arrivals, warmup)
    span = end - start
    return sum(start <= t <= end for t in arrivals) / span if span > 0 else math.nan


def capacity_rps(requests: Sequence[workload.Request], opts: SimOptions) -> float:
    """Completed req/s of the fleet in `opts` with a backlog: every request arrives at t=0
    and is served FCFS (shortest-first would finish short ones first and overstate it);
    counted until the last request starts, so the emptying batch at the end is left out."""
    fcfs = msgspec.structs.replace(opts.config.scheduler, policy="fcfs")
    opts = msgspec.structs.replace(opts, config=msgspec.structs.replace(opts.config,
                                                                       scheduler=fcfs))
    burst = [msgspec.structs.replace(r, arrival_s=0.0) for r in requests]
    results = simulate(burst, [Estimate(None)] * len(burst), opts).results
    last_start = max(r.ttft_s for r in results if r.ok)
    return sum(r.ok and r.jct_s <= last_start for r in results) / last_start
