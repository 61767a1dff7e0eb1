"""Every policy side by side on the same seeded workload, simulated in virtual time.

    python -m bench.policy_sim --num 2000 --load 0.9 --arrivals gamma --cv 2 --tau 0.5

`compare(...)` is the function behind the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from bench.policy_sim.overhead import Overhead, measure_overhead
from bench.policy_sim.report import Summary, summarize
from bench.policy_sim.run import Outcome, SimSetup, simulate
from bench.policy_sim.workload import Request, WorkloadSpec, make_workload, sigma_for_tau
from daemon.core.costmodel import CostModel

__all__ = ["Outcome", "Overhead", "Request", "SimSetup", "Summary", "WorkloadSpec", "compare",
           "make_workload", "measure_overhead", "simulate", "summarize"]


def compare(policies: Sequence[str], spec: WorkloadSpec, setup: SimSetup,
            overhead: bool = True) -> tuple[list[Summary], list[Overhead], list[Request]]:
    requests = make_workload(spec, CostModel.from_sim(setup.sim), setup.executors,
                             setup.max_running)
    if setup.iterative_sigma is None:
        truth = np.log([r.output_tokens for r in requests])
        setup = replace(setup, iterative_sigma=sigma_for_tau(spec.tau, float(np.std(truth))))
    outcomes = [simulate(name, requests, setup) for name in policies]
    overheads = [measure_overhead(name, setup, spec) for name in policies] if overhead else []
    return summarize(outcomes), overheads, requests
