"""`lengthwise bench fleet`: see bench/fleet/__init__.py.

    lengthwise bench fleet --out out/fleet      # 8, 16, 32, 64 executors x 3 placements

Default: the 13B roofline profile (64 slots per executor, its max_num_seqs), the Azure
conversation trace for arrivals and lengths, ssjf with noisy-oracle predictions (sigma
0.8), 0.9 load per executor (one executor's capacity is measured first, on the first
--calibrate-num requests). Every size serves the same --num requests (one window of the
trace), their arrival times rescaled to N x the per-executor rate: sizes differ only in
the fleet, and a larger fleet simulates a shorter span.

    lengthwise bench fleet --per-executor 150 --out out/fleet-steady

--per-executor K: size N serves the first N x K requests of one trace window (consecutive
rows, largest size's count drawn once), rescaled so that their own mean rate is N x the
per-executor rate: every size simulates about the same span, long enough for a steady
state at every size when K is (throughput vs linear), at the price of runs that grow with N.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench import costfile, workload
from bench.fleet import report
from bench.fleet.run import FleetPoint, capacity_rps, run_point
from bench.pool import run_pool
from bench.sim.cli import add_config_arguments, config_from_args, sim_from_args
from bench.sim.predictions import PREDICTORS, Estimate, predictions
from bench.sim.run import SimOptions
from daemon.config import Config, ConfigError, slots_per_engine

ROOT = Path(__file__).resolve().parents[2]
ROOFLINE = ROOT / "bench" / "profiles" / "llama2-13b-a100-roofline.json"
AZURE_CONV = ROOT.parent / "shared" / "data" / "azure_llm_2023_conv.csv"
PLACEMENTS = "predicted,least_queue,round_robin"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fleet", help="fleets of simulated executors behind one dispatcher")
    p.add_argument("--sizes", type=_ints, default=[8, 16, 32, 64], help="executors per run")
    p.add_argument("--placements", default=PLACEMENTS,
                   help="central binding: [scheduler] placement values; router binding: "
                   "the router's scores of the same names (bench/sim/router.py)")
    p.add_argument("--bindings", default="central,router",
                   help="central: one daemon, its core places jobs as slots free; router: "
                   "one daemon per executor, a router places each job on arrival (EPP)")
    p.add_argument("--load", type=float, default=0.9,
                   help="offered rate per executor as a share of one executor's capacity")
    p.add_argument("--per-executor-rate", type=float, default=None,
                   help="req/s per executor (skips measuring the capacity)")
    p.add_argument("--per-executor", type=int, default=None, metavar="K",
                   help="K requests per executor: size N serves the first N x K requests "
                   "of the trace window at N x the per-executor rate (replaces --num)")
    p.add_argument("--calibrate-num", type=int, default=600,
                   help="backlog that measures one executor's capacity")
    p.add_argument("--predictor", default="noisy-oracle:0.8", help=PREDICTORS)
    p.add_argument("--natural", action="store_true", help="as `lengthwise sim --natural`")
    p.add_argument("--workers", type=int, default=2, help="simulations run in parallel")
    p.add_argument("--out", type=Path, help="write fleet.json, fleet.md, fleet.png")
    add_config_arguments(p)
    workload.add_arguments(p)
    trace = f"trace:{AZURE_CONV}"
    p.set_defaults(func=run_fleet, arrivals=trace, lengths=trace, max_input=3072,
                   max_model_len=4096, profile=ROOFLINE, policy="ssjf", num=4800,
                   max_running=costfile.load(ROOFLINE).max_num_seqs)


def _options(args: argparse.Namespace, config: Config, executors: int) -> SimOptions:
    return SimOptions(config=config, sim=sim_from_args(args, config), executors=executors,
                      natural=args.natural, max_model_len=args.max_model_len, seed=args.seed)


def _requests(args: argparse.Namespace) -> tuple[list[workload.Request], list[Estimate]]:
    """The requests at 1 req/s and their predictions; prompt texts are dropped afterwards
    (the simulator needs only token counts, and the requests are pickled to the workers)."""
    requests = workload.build(workload.spec_from_args(args, rate=1.0))
    preds = predictions(requests, args.predictor, args.seed)
    return [msgspec.structs.replace(r, messages=[]) for r in requests], preds


def mean_rate(requests: Sequence[workload.Request]) -> float:
    """Arrivals per second over the requests' own span (1 without a span: the window was
    built at 1 req/s)."""
    span = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    return (len(requests) - 1) / span if span > 0 else 1.0


def run_fleet(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        placements = [p for p in args.placements.split(",") if p]
        bindings = [b for b in args.bindings.split(",") if b]
        if set(bindings) - {"central", "router"}:
            raise ConfigError(f"--bindings {args.bindings!r}: central and/or router")
        for placement in placements:  # refused with the key's name, as in a file
            config_from_args(args, [f"scheduler.placement={placement}"])
    except ConfigError as exc:
        print(f"lengthwise bench fleet: {exc}", file=sys.stderr)
        return 2
    if args.per_executor is not None:
        if args.per_executor < 2:
            print("lengthwise bench fleet: --per-executor must be >= 2", file=sys.stderr)
            return 2
        args.num = max(max(args.sizes) * args.per_executor, args.calibrate_num)
    requests, preds = _requests(args)
    rate = args.per_executor_rate
    capacity = float("nan")
    if rate is None:
        capacity = capacity_rps(requests[:args.calibrate_num], _options(args, config, 1))
        rate = args.load * capacity
        print(f"one executor serves {capacity:.3g} req/s under a backlog: {rate:.3g} req/s "
              f"per executor is load {args.load:g}", file=sys.stderr)
    jobs = []
    for n in sorted(args.sizes, reverse=True):  # the costliest runs start first
        mine, my_preds, built_at = requests, preds, 1.0
        if args.per_executor is not None:  # a head of the window: its own mean rate
            mine, my_preds = requests[:n * args.per_executor], preds[:n * args.per_executor]
            built_at = mean_rate(mine)
        at_rate = workload.at_rate(mine, built_at, n * rate)
        jobs += [(binding, placement, n * rate, at_rate, my_preds, _options(args, config, n))
                 for binding in bindings for placement in placements]
    points: list[FleetPoint] = run_pool(run_point, jobs, args.workers, desc="fleet runs")
    res = report.FleetResults(
        policy=config.scheduler.policy, predictor=args.predictor, profile=args.profile.stem,
        max_running=slots_per_engine(config), arrivals=args.arrivals,
        lengths=args.lengths, per_executor=args.per_executor, num=args.num,
        load=args.load if args.per_executor_rate is None else float("nan"),
        capacity_rps=capacity, per_executor_rps=rate, points=points)
    _write(res, args.out)
    return 0


def _write(res: report.FleetResults, out: Path | None) -> None:
    text = "\n".join([report.title(res), "", report.table(res), "",
                      *report.summary_lines(res)]) + "\n"
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fleet.json").write_bytes(msgspec.json.format(msgspec.json.encode(res)))
        (out / "fleet.md").write_text(text)
        report.plot(res, out / "fleet.png")
    print(text)
