"""CLI: python -m bench.policy_sim [workload flags] [--config lengthwise.toml] [--json]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from bench.policy_sim import compare, measure_overhead
from bench.policy_sim.report import overhead_table, table, targets
from bench.policy_sim.run import SimSetup
from bench.policy_sim.workload import WorkloadSpec
from daemon.config import Config, load

ALL = ["fcfs", "ssjf", "isrtf", "alise", "scls", "oracle-sjf", "oracle-srpt"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.policy_sim", description=__doc__)
    p.add_argument("--policies", default=",".join(ALL))
    p.add_argument("--num", type=int, default=2000, help="requests")
    p.add_argument("--load", type=float, default=0.9, help="offered load / capacity")
    p.add_argument("--arrivals", choices=["poisson", "gamma"], default="gamma")
    p.add_argument("--cv", type=float, default=2.0, help="gamma inter-arrival CV")
    p.add_argument("--lengths", choices=["sharegpt", "azure"], default="sharegpt")
    p.add_argument("--tau", type=float, default=0.5, help="Kendall tau of predictions")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--executors", type=int, default=1)
    p.add_argument("--max-running", type=int, default=4)
    p.add_argument("--promote-after", type=float, default=None,
                   help="aging threshold s (default: the config's); 0 = aging off")
    p.add_argument("--iter-sigma", type=float, default=None,
                   help="log-noise of the iterative predictor (default: the first one's)")
    p.add_argument("--config", type=Path, help="TOML with [policies.*], [sim], [scheduler.aging]")
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--overhead-only", action="store_true",
                   help="only the per-decision overhead at 1,000 waiting")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def setup_from(args: argparse.Namespace) -> SimSetup:
    config = load(args.config) if args.config else Config()
    aging = config.scheduler.aging
    promote = aging.promote_after_s if aging.enabled else None
    if args.promote_after is not None:
        promote = args.promote_after or None
    return SimSetup(args.executors, args.max_running, promote, config.policies, config.sim,
                    args.iter_sigma, args.seed)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    spec = WorkloadSpec(args.num, args.load, args.arrivals, args.cv, args.lengths, args.tau,
                        args.max_tokens, args.seed)
    setup = setup_from(args)
    if args.overhead_only:
        print(overhead_table([measure_overhead(name, setup, spec)
                              for name in args.policies.split(",")]))
        return 0
    rows, overheads, requests = compare(args.policies.split(","), spec, setup,
                                        overhead=not args.no_overhead)
    truth = np.array([r.output_tokens for r in requests])
    tau = float(kendalltau(truth, [r.predicted_tokens for r in requests]).statistic)
    span = requests[-1].arrival_s - requests[0].arrival_s
    head = {"spec": spec.__repr__(), "setup": repr(setup), "rate_rps": len(requests) / span,
            "mean_output_tokens": float(truth.mean()), "kendall_tau": tau}
    if args.json:
        json.dump({**head, "policies": [r.as_dict() for r in rows],
                   "overhead": [o.__repr__() for o in overheads],
                   "targets": targets(rows, overheads)}, sys.stdout, indent=1)
        print()
        return 0
    print(f"workload: {spec}\nsetup: {setup}")
    print(f"offered {head['rate_rps']:.3f} req/s, mean output {truth.mean():.0f} tokens, "
          f"predictions' Kendall tau {tau:.2f}\n")
    print(table(rows))
    if overheads:
        print("\nper-decision overhead, 1,000+ waiting:\n" + overhead_table(overheads))
    print("\n" + "\n".join(targets(rows, overheads)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
