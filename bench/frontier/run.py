"""Runs a frontier's systems in the simulator (a process pool: one run per core), and
calibrates the arrival rate on FCFS."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from bench import workload
from bench.metrics import Summary, summarize
from bench.pool import run_pool
from bench.sim.predictions import Estimate
from bench.sim.run import SimOptions, simulate
from daemon.config import Config

Requests = Sequence[workload.Request]
Predictions = Sequence[Estimate]
# Gap between requests served "alone" (virtual seconds): far longer than any one job
# (checked), and small enough that 1e5 requests keep sub-ns float resolution.
ALONE_GAP_S = 100.0


class Outcome(msgspec.Struct, kw_only=True):
    label: str
    overrides: list[str]
    summary: Summary
    preemptions: int
    budget_yields: int
    wall_s: float  # of the simulation, in its worker


def _run_one(label: str, overrides: list[str], requests: Requests, preds: Predictions,
             opts: SimOptions) -> Outcome:
    run = simulate(requests, preds, opts)
    return Outcome(label=label, overrides=overrides, summary=summarize(run.results),
                   preemptions=run.preemptions, budget_yields=run.budget_yields,
                   wall_s=run.wall_s)


def run_all(systems: Sequence[tuple[str, list[str], Config]], requests: Requests,
            preds: Predictions, opts: SimOptions, workers: int = 2) -> list[Outcome]:
    """Every system on the same requests and predictions; results in the systems' order."""
    jobs = [(label, overrides, requests, preds, msgspec.structs.replace(opts, config=config))
            for label, overrides, config in systems]
    return run_pool(_run_one, jobs, workers, desc="systems")


def alone(requests: Requests) -> list[workload.Request]:
    """The same requests, each served alone (unloaded)."""
    return [msgspec.structs.replace(r, arrival_s=i * ALONE_GAP_S)
            for i, r in enumerate(requests)]


def calibrate(mean_jct_at: Callable[[float], float], unloaded: float, target: float,
              guess: float, tol: float = 0.01, max_steps: int = 30) -> tuple[float, float]:
    """Rate at which mean_jct_at(rate) / unloaded == target (bisection on log rate; mean
    JCT grows with the rate). Returns (rate, achieved ratio)."""
    def ratio(rate: float) -> float:
        return mean_jct_at(rate) / unloaded

    lo, hi = guess, guess
    r_lo, r_hi = ratio(lo), math.nan
    steps = 1
    while r_lo > target and steps < max_steps:  # bracket from below ...
        lo, steps = lo / 2, steps + 1
        r_lo = ratio(lo)
    hi, r_hi = lo * 2, ratio(lo * 2)
    while r_hi < target and steps < max_steps:  # ... and from above
        lo, r_lo = hi, r_hi
        hi, steps = hi * 2, steps + 1
        r_hi = ratio(hi)
    best = min(((lo, r_lo), (hi, r_hi)), key=lambda p: abs(p[1] / target - 1))
    while abs(best[1] / target - 1) > tol and steps < max_steps:
        mid = float(np.sqrt(lo * hi))
        r_mid, steps = ratio(mid), steps + 1
        if r_mid < target:
            lo = mid
        else:
            hi = mid
        best = min((best, (mid, r_mid)), key=lambda p: abs(p[1] / target - 1))
    return best
