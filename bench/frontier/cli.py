"""`lengthwise bench frontier`: see bench/frontier/__init__.py.

    lengthwise bench frontier --out out/frontier            # issue 10's default workload
    lengthwise bench frontier --system ssjf-k4=scheduler.policy=ssjf,scheduler.aging.slowdown=4 ...

Default workload: bursty Gamma arrivals (CV 2.5), 1,500 ShareGPT first turns from the dev
hold-out, outputs x 0.25 capped at 256, the tiny-llama stack profile, 1 executor x 4 slots,
the shipped predictor, at the rate where FCFS's mean JCT is 3x its unloaded mean JCT.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from bench import workload
from bench.frontier import report
from bench.frontier.run import ALONE_GAP_S, Outcome, alone, calibrate, run_all
from bench.frontier.systems import BASELINE, DEFAULT_SYSTEMS, parse_system, with_baseline
from bench.metrics import summarize
from bench.sim.cli import add_config_arguments, add_sim_arguments, config_from_args, sim_options
from bench.sim.predictions import Estimate, predictions
from bench.sim.run import SimOptions, simulate
from daemon.config import ConfigError, slots_per_engine

STACK_PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "tiny-llama-cpu-stack.json"
_CALIBRATE_RATE = 1.0  # the rate the workload is drawn at before it is rescaled


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("frontier", help="systems side by side in the simulator, vs FCFS")
    p.add_argument("--system", action="append", default=[], metavar="LABEL=KEY=VALUE,...",
                   help="a system as config overrides (repeatable; default: issue 10's "
                   "ssjf / oracle-sjf aging sweeps, isrtf, alise, scls); fcfs always runs")
    p.add_argument("--calibrate", type=float, default=None, metavar="X",
                   help="pick the rate where FCFS's mean JCT is X x unloaded (default 3 "
                   "unless --rate is given)")
    p.add_argument("--workers", type=int, default=2, help="simulations run in parallel")
    p.add_argument("--forced", dest="natural", action="store_false",
                   help="max_tokens = the true length (as `bench compare` sends it; the core then "
                   "does not trust the budget); default: jobs stop at their true length with "
                   "the context room as max_tokens")
    p.add_argument("--out", type=Path, help="write frontier.json, frontier.md, frontier.png")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    add_config_arguments(p)
    add_sim_arguments(p)
    workload.add_arguments(p)
    p.set_defaults(func=run_frontier, arrivals="gamma", cv=2.5, num=1500, scale=0.25,
                   cap=256, rate=None, profile=STACK_PROFILE, max_running=4, natural=True)


def _mean_jct(requests: list[workload.Request], preds: list[Estimate],
              opts: SimOptions) -> float:
    return summarize(simulate(requests, preds, opts).results).mean_jct


def unloaded_mean_jct(requests: list[workload.Request], preds: list[Estimate],
                      opts: SimOptions) -> float:
    """Mean JCT of the requests each served alone (FCFS, an empty system)."""
    results = simulate(alone(requests), preds, opts).results
    if max(r.jct_s for r in results) >= ALONE_GAP_S:
        raise RuntimeError(f"a request took over {ALONE_GAP_S} s alone: not unloaded")
    return summarize(results).mean_jct


def choose_rate(requests: list[workload.Request], preds: list[Estimate], opts: SimOptions,
                target: float, unloaded: float) -> tuple[float, float]:
    """(rate, FCFS mean JCT / unloaded there) for requests drawn at rate 1."""
    slots = opts.executors * slots_per_engine(opts.config)
    return calibrate(
        lambda r: _mean_jct(workload.at_rate(requests, _CALIBRATE_RATE, r), preds, opts),
        unloaded, target, guess=slots / unloaded / 2)


def run_frontier(args: argparse.Namespace) -> int:
    try:
        systems = with_baseline([parse_system(s) for s in (args.system or DEFAULT_SYSTEMS)])
        configs = [(s.label, s.overrides, config_from_args(args, s.overrides)) for s in systems]
    except (ConfigError, ValueError) as exc:
        print(f"lengthwise bench frontier: {exc}", file=sys.stderr)
        return 2
    target = args.calibrate if args.calibrate or args.rate else 3.0
    spec = workload.spec_from_args(args, rate=args.rate or _CALIBRATE_RATE)
    workload.warn_sample(spec)
    requests = workload.build(spec)
    fcfs = sim_options(args, configs[0][2])
    preds = predictions(requests, args.predictor, args.seed,
                        fcfs.config.scheduler.admission_quantile)
    unloaded = unloaded_mean_jct(requests, preds, fcfs)
    if target:
        rate, _ = choose_rate(requests, preds, fcfs, target, unloaded)
        print(f"calibrated: {rate:.4g} req/s puts FCFS's mean JCT at {target:g} x unloaded "
              f"({unloaded:.3f} s)", file=sys.stderr)
        requests = workload.at_rate(requests, spec.rate, rate)
        spec = msgspec.structs.replace(spec, rate=rate)
    outcomes = run_all(configs, requests, preds, fcfs, workers=args.workers)
    results = _results(args, spec, target or None, unloaded, outcomes)
    _write(results, args)
    return 0


def _results(args: argparse.Namespace, spec: workload.WorkloadSpec, target: float | None,
             unloaded: float, outcomes: list[Outcome]) -> report.FrontierResults:
    assert outcomes[0].label == BASELINE
    return report.FrontierResults(
        workload=spec, sample=workload.sample_label(spec), predictor=args.predictor,
        natural=args.natural, calibrate=target, unloaded_mean_jct=unloaded,
        fcfs_load_ratio=outcomes[0].summary.mean_jct / unloaded,
        rows=report.rows_of(outcomes))


def _write(results: report.FrontierResults, args: argparse.Namespace) -> None:
    spec = results.workload
    title = (f"{spec.lengths} {spec.arrivals} CV {spec.cv:g}, {spec.num} req at "
             f"{spec.rate:.3g} req/s (FCFS {results.fcfs_load_ratio:.2f}x unloaded), "
             f"predictor {results.predictor}"
             + ("" if results.natural else ", forced budgets"))
    text = f"{title}\n\n{report.table(results.rows)}\n"
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "frontier.json").write_bytes(
            msgspec.json.format(msgspec.json.encode(results)))
        (args.out / "frontier.md").write_text(text)
        report.plot(results.rows, args.out / "frontier.png", title)
    print(msgspec.json.encode(results).decode() if args.json else text)
