"""`lengthwise sim`: one workload through the real scheduler core and policies on simulated
engines, in virtual time. Prints the same summary JSON as `bench run`, plus the run's
preemption counts; `--overhead` adds the per-decision cost with ~1,000 jobs waiting.
The config is the daemon's own (see bench/sim/overrides.py); several systems side by side,
with ratios to FCFS and a plot: `lengthwise bench frontier`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from bench import client, costfile, workload
from bench.metrics import summarize, to_json
from bench.sim.overhead import burst_size, measure_overhead, overhead_table
from bench.sim.overrides import build_config, build_sim, split_sim
from bench.sim.predictions import PREDICTORS, predictions
from bench.sim.run import SimOptions, simulate
from daemon.config import Config, ConfigError, cost_profile
from daemon.executors.settings import SimConfig


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """--config, --profile, --set and their shorthands (all applied as overrides)."""
    p.add_argument("--config", type=Path, help="start from this lengthwise TOML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted, repeatable; benchmark knobs too), "
                   "e.g. scheduler.policy=ssjf or policies.isrtf.margin=0.5; sim.KEY sets the "
                   "simulated engine (sim.decode_base_s=0.01)")
    p.add_argument("--profile", type=Path, help="cost profile JSON (bench/profiles/): the "
                   "simulated engine's costs, which the policies estimate with too ('none': "
                   "the config's [costmodel] profile, else the generic cost model)")
    p.add_argument("--policy", help="shorthand for --set scheduler.policy=P")
    p.add_argument("--max-running", type=int,
                   help="shorthand for --set scheduler.max_running=N (jobs per engine)")
    p.add_argument("--promote-after", type=float,
                   help="shorthand for --set scheduler.aging.promote_after_s=S")
    p.add_argument("--no-aging", action="store_true",
                   help="shorthand for --set scheduler.aging.enabled=false")


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """Shorthands, then --set: a later item wins (sim.* items included)."""
    items = []
    if args.policy is not None:
        items.append(f"scheduler.policy={args.policy}")
    if args.max_running is not None:
        items.append(f"scheduler.max_running={args.max_running}")
    if args.promote_after is not None:
        items.append(f"scheduler.aging.promote_after_s={args.promote_after!r}")
    if args.no_aging:
        items.append("scheduler.aging.enabled=false")
    return items + list(args.set)


def config_from_args(args: argparse.Namespace, extra: list[str] | None = None) -> Config:
    config_items, _ = split_sim(overrides_from_args(args) + (extra or []))
    return build_config(args.config, config_items)


def sim_from_args(args: argparse.Namespace, config: Config) -> SimConfig:
    """The simulated engine: --profile's coefficients (else the config's cost profile), then
    the sim.* items of --set."""
    if args.profile and str(args.profile) != "none":
        base = costfile.load(args.profile).sim
    else:
        base = cost_profile(config)
    return build_sim(base, split_sim(overrides_from_args(args))[1])


def add_sim_arguments(p: argparse.ArgumentParser) -> None:
    """What a simulated run needs besides the config and the workload."""
    p.add_argument("--executors", type=int, default=1, help="simulated engines")
    p.add_argument("--predictor", default="default", help=PREDICTORS)
    p.add_argument("--iterative", default="", help="remaining-length re-predictions for "
                   "isrtf/alise: noisy[:SIGMA] (truth x shrinking lognormal noise); "
                   "default: the policy's own rule")
    p.add_argument("--natural", action="store_true", help="jobs stop at their true length "
                   "by themselves and max_tokens is the room left in the context. Without it "
                   "max_tokens is the true length, as in `bench compare`, and the core is "
                   "told not to cap predictions by it (the benchmark knob "
                   "scheduler.trust_budget = false), "
                   "or predicted policies would read the truth off the budget")


def sim_options(args: argparse.Namespace, config: Config) -> SimOptions:
    return SimOptions(config=config, sim=sim_from_args(args, config), executors=args.executors,
                      natural=args.natural, max_model_len=args.max_model_len,
                      iterative=args.iterative, seed=args.seed,
                      slo=client.sent_slo(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lengthwise sim", description=__doc__.split("\n")[0])
    add_config_arguments(p)
    add_sim_arguments(p)
    p.add_argument("--slo-ttft", type=float, default=None)
    p.add_argument("--slo-tpot", type=float, default=None)
    p.add_argument("--send-slo", action="store_true",
                   help="every request carries --slo-ttft/--slo-tpot as its objective (as "
                   "llm-d's headers send it): the core refuses what it cannot serve in time")
    p.add_argument("--overhead", action="store_true",
                   help="also time decision rounds with 1,000 jobs waiting")
    p.add_argument("--json", action="store_true")
    p.add_argument("--requests-out", type=Path, help="per-request results (JSONL)")
    workload.add_arguments(p)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        opts = sim_options(args, config_from_args(args))
    except ConfigError as exc:
        print(f"lengthwise sim: {exc}", file=sys.stderr)
        return 2
    spec = workload.spec_from_args(args)
    workload.warn_sample(spec)
    requests = workload.build(spec)
    quantile = opts.config.scheduler.admission_quantile
    run = simulate(requests, predictions(requests, args.predictor, args.seed, quantile), opts)
    summary = summarize(run.results, args.slo_ttft, args.slo_tpot)
    if args.requests_out:
        args.requests_out.write_bytes(b"\n".join(msgspec.json.encode(r) for r in run.results))
    virtual = max((r.finish_s for r in run.results if r.ok), default=0.0)
    print(f"simulated {virtual:.1f} s of serving in {run.wall_s:.1f} s wall", file=sys.stderr)
    extra = {"policy": opts.config.scheduler.policy, "sample": workload.sample_label(spec),
             "preemptions": run.preemptions, "budget_yields": run.budget_yields,
             "repredictions": run.repredictions, "wall_s": run.wall_s}
    text = to_json(summary, extra)
    print(text if args.json else msgspec.json.format(text))
    if args.overhead:
        burst = msgspec.structs.replace(spec, num=burst_size(opts))
        reqs = workload.build(burst)
        print(overhead_table([measure_overhead(reqs, predictions(reqs, args.predictor,
                                                                 args.seed, quantile), opts)]))
    return 0 if summary.n_completed else 1
