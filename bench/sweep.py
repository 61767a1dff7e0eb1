"""`lengthwise bench sweep`: vLLM's own server against lengthwise over a list of loads,
alternating, with several repetitions, and the curves a scheduler is judged by.

Loads are multiples of a capacity rate: `--capacity RPS`, or measured first in the same
session as what vLLM's server completes under a backlog (bench compare's measure_capacity:
a fresh vLLM server, every request of the workload sent at once by vLLM's client,
completed requests / (first send -> last completion)).

Each repetition starts every system afresh (one after the other, each warmed with compare's
unmeasured burst) and keeps them up while it runs the loads in ascending order; at each
load the systems take turns, the order rotating with load and repetition (A B, then B A:
ABAB across repetitions at one load), so that a slow spell of a shared machine hits both.
An idle server costs ~0.01 core (vLLM's tiny CPU server, measured). Every run uses vLLM's
own bench client and the same held-out prompts, salted per load so that no run finds the
previous load's prompts in a prefix cache.

Writes OUT/runs/SYSTEM-xLOAD-REPEAT.json (one run: its figures and every request),
OUT/sweep.json (every run's figures, per (load, system) medians with min-max, SLO
capacities, engine-speed pairs), OUT/summary.md (the tables it prints) and the plots
(bench/sweep_plots.py); each server's log, OUT/SYSTEM.log for the first repetition's start
and OUT/SYSTEM-N.log for repetition N + 1's (every system starts again each repetition).
Runs are counted by a progress bar.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import msgspec
from tqdm import tqdm

from bench import compare, enginespeed, vllm_client, workload
from bench.metrics import RequestResult, Summary
from bench.servers import Server, Settings, System, describe_waits, parse_system
from bench.sweepstats import (
    Adjusted,
    Pair,
    PairedLoad,
    Point,
    SweepRun,
    SystemCapacity,
    at_equal_speed,
    attainment,
    capacities,
    p99_tpot,
    paired_loads,
    pairs,
    points,
)
from daemon.core.job import Slo

LOADS = "0.2,0.4,0.6,0.8,1.0,1.5,2.0"


class SweepResults(msgspec.Struct, kw_only=True):
    model: str
    systems: list[str]  # the first is the baseline of every ratio and pair
    loads: list[float]
    repeats: int
    capacity_rps: float  # the rate of load 1.0
    capacity_how: str  # given, or how it was measured
    workload: workload.WorkloadSpec  # rate is per run
    sample: str  # held-out | in-sample | reserved-test | external
    slo_ttft: float | None
    slo_tpot: float | None
    slo: Slo | None  # the objective every request carried (--send-slo), else None
    slo_exempt: list[str] = []  # systems whose requests carried none (--send-slo-except)
    max_num_seqs: int
    kv_blocks: int
    max_running: str
    client: str = "vllm"  # vllm (vLLM's own bench client) | ours
    startup_s: dict[str, list[float]] = {}
    runs: list[SweepRun] = []
    points: list[Point] = []
    capacities: list[SystemCapacity] = []
    pairs: list[Pair] = []
    adjusted: list[Adjusted] = []
    paired: list[PairedLoad] = []


# Summary's float fields: nan (no request completed) is null in JSON, nan again when read.
_FLOATS = frozenset(f.name for f in msgspec.structs.fields(Summary) if f.type is float)


def load_results(path: Path) -> SweepResults:
    """OUT/sweep.json as written (runs where nothing completed included, and pair-by-pair
    rows whose every pair was flagged: their nan is null in JSON too)."""
    raw = msgspec.json.decode(path.read_bytes())
    for run in raw["runs"]:
        run["summary"] = {key: math.nan if value is None and key in _FLOATS else value
                          for key, value in run["summary"].items()}
    for row in raw.get("paired", []):
        row["unflagged"] = {key: math.nan if value is None else value
                            for key, value in row["unflagged"].items()}
    return msgspec.convert(raw, SweepResults)


def _client(results: SweepResults) -> str:
    if results.client == "vllm":
        return "vLLM's own bench client"
    return "Our client (bench/client.py): no engine step times"


class RunFile(msgspec.Struct, kw_only=True):
    run: SweepRun
    requests: list[RequestResult]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from bench import client
    from daemon.core.settings import SchedulerConfig

    p = sub.add_parser("sweep", help="vLLM's server against lengthwise over a list of loads")
    p.add_argument("--loads", default=LOADS,
                   help="comma list of loads, multiples of the capacity rate")
    p.add_argument("--capacity", type=float, default=0.0,
                   help="req/s of load 1.0; 0 (default): measure vLLM's server under a "
                        "backlog of the workload first")
    p.add_argument("--systems", default=f"vllm,lengthwise:{SchedulerConfig().policy}",
                   help="comma list (vllm | lengthwise:POLICY[+KEY=VALUE...]); the first is "
                        "the baseline of ratios and engine-speed pairs")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of every load")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--report", action="store_true",
                   help="run nothing: recompute the figures, summary.md and plots of the "
                        "sweep already in --out (OUT/sweep.json)")
    p.add_argument("--client", choices=("vllm", "ours"), default="vllm",
                   help="vllm (default): vLLM's own bench client, whose token times give "
                        "the engine's step time; ours: bench/client.py (no step times, "
                        "no flagged pairs; spares the ~19 s of CPU vLLM's client takes to "
                        "start per run)")
    compare.add_engine_arguments(p)
    client.add_arguments(p)
    workload.add_arguments(p)
    p.set_defaults(func=run_sweep, num=150, cap=256)


def _systems(args: argparse.Namespace) -> list[System]:
    systems = [parse_system(s) for s in args.systems.split(",") if s]
    if not systems or len({s.spec for s in systems}) != len(systems):
        raise SystemExit("--systems: give each system once")
    if any(s.client_priority != "none" for s in systems):
        raise SystemExit("vLLM's client cannot send a per-request priority: drop vllm-priority")
    from bench import client

    if unknown := set(client.slo_exempt(args)) - {s.spec for s in systems}:
        raise SystemExit(f"--send-slo-except: {', '.join(sorted(unknown))} not in --systems")
    compare.check_engine_kind(args, systems, args.capacity <= 0)
    return systems


def _loads(text: str) -> list[float]:
    try:
        loads = sorted({float(x) for x in text.split(",") if x})
    except ValueError:
        raise SystemExit(f"--loads: {text!r} is not a comma list of numbers") from None
    if not loads or loads[0] <= 0:
        raise SystemExit("--loads: give positive multiples of the capacity rate")
    return loads


def _capacity(settings: Settings, args: argparse.Namespace) -> tuple[float, str]:
    if args.capacity > 0:
        return args.capacity, "given (--capacity)"
    rps = compare.measure_capacity(settings, args, args.out)
    who = "vLLM's client" if args.client == "vllm" else "our client"
    return rps, (f"measured: a fresh vLLM server, all {args.num} requests of the workload "
                 f"sent at once by {who}; completed requests / (first send -> last "
                 f"completion) = {rps:.3g} req/s")


def run_sweep(args: argparse.Namespace) -> int:
    if args.report:
        print(finish(load_results(args.out / "sweep.json"), args.out))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(exist_ok=True)
    systems, loads = _systems(args), _loads(args.loads)
    settings = compare.settings_from_args(args)
    spec = workload.spec_from_args(args)
    workload.warn_sample(spec)
    workload.build(spec)  # fail early on bad flags
    capacity, how = _capacity(settings, args)
    print(f"capacity (load 1.0): {capacity:.3g} req/s, {how}", flush=True)
    from bench import client

    results = SweepResults(
        model=args.model.name, systems=[s.spec for s in systems], loads=loads,
        repeats=args.repeats, capacity_rps=capacity, capacity_how=how, workload=spec,
        sample=workload.sample_label(spec), slo_ttft=args.slo_ttft, slo_tpot=args.slo_tpot,
        slo=client.sent_slo(args), slo_exempt=client.slo_exempt(args),
        max_num_seqs=args.max_num_seqs, kv_blocks=args.kv_blocks,
        max_running=args.max_running, client=args.client)
    try:
        with tqdm(total=len(loads) * args.repeats * len(systems), unit="run",
                  file=sys.stderr) as bar:
            for repeat in range(args.repeats):
                _repetition(systems, settings, args, results, repeat, bar)
    except BaseException:  # a failed server, Ctrl-C: the runs done are still summarized
        if results.runs:
            print(finish(results, args.out) + "\n(partial: the sweep stopped early)")
        raise
    print(finish(results, args.out))
    return 0


def _repetition(systems: list[System], settings: Settings, args: argparse.Namespace,
                results: SweepResults, repeat: int, bar: tqdm) -> None:
    """Start every system, then every load with the systems taking turns; stop them."""
    servers: dict[str, Server] = {}
    try:
        for system in systems:
            bar.set_description(f"starting {system.spec} #{repeat + 1}")
            server = servers[system.spec] = Server(system, settings, args.out,
                                                   f"-{repeat}" if repeat else "")
            results.startup_s.setdefault(system.spec, []).append(server.wait_ready())
            compare.warm_up(server, system, args)
        for k, load in enumerate(results.loads):
            order = [systems[(k + repeat + i) % len(systems)] for i in range(len(systems))]
            for position, system in enumerate(order):
                bar.set_description(f"{system.spec} @ {load:g}x #{repeat + 1}")
                run = _one_run(servers[system.spec], system, args, results, (k, load),
                               repeat, position)
                results.runs.append(run)
                bar.write(describe(run))
                bar.update(1)
                (args.out / "sweep.json").write_bytes(msgspec.json.encode(results))
            for pair in pairs([r for r in results.runs if (r.load, r.repeat) == (load, repeat)],
                              results.systems[0]):
                if pair.flagged:
                    bar.write(f"warning: {pair.system}'s engine steps took {pair.step_ratio:.2f}x "
                              f"{results.systems[0]}'s at {load:g}x #{repeat + 1}: this pair "
                              "measured the machine as much as the schedulers")
    finally:
        for server in servers.values():
            server.stop()


def _one_run(server: Server, system: System, args: argparse.Namespace,
             results: SweepResults, load: tuple[int, float], repeat: int,
             position: int) -> SweepRun:
    k, multiple = load
    rate = round(multiple * results.capacity_rps, 4)
    path = run_file(args.out, system.label, multiple, repeat)
    tag = path.stem
    # The same salt for every system (same work), another at each load (a server stays up
    # over the loads of a repetition: no run finds the last load's prompts in its cache).
    opts = compare.run_options(system, args, compare.salt(k))
    # Each repetition draws its own workload (seed + repetition), every system the same one:
    # repetitions then sample workloads, not only the machine's noise on one.
    drawn = argparse.Namespace(**{**vars(args), "seed": args.seed + repeat})
    logged = server.log_path.stat().st_size  # the run's step lines (--step-log) follow
    record = compare.measure_run(server, system, drawn, rate, opts, args.out, repeat, tag)
    speed = enginespeed.from_result_file(vllm_client.result_path(args.out / "vllm-client", tag))
    engine_speed = None
    if args.step_log:
        with server.log_path.open("rb") as log:
            log.seek(logged)
            engine_speed = enginespeed.from_step_lines(
                log.read().decode(errors="replace").splitlines())
    run = SweepRun(system=system.spec, load=multiple, rate=rate, repeat=repeat,
                   position=position, summary=record.summary,
                   p99_tpot=p99_tpot(record.requests),
                   attainment=attainment(record.requests, args.slo_ttft, args.slo_tpot),
                   refused=max(record.server_refused, record.summary.n_refused),
                   engine_preemptions=record.engine_preemptions,
                   policy_preemptions=record.policy_preemptions, speed=speed,
                   engine_speed=engine_speed,
                   wall_s=record.wall_s, cpu=record.cpu,
                   learned_profile=record.learned_profile, waits=record.waits)
    path.write_bytes(msgspec.json.encode(RunFile(run=run, requests=record.requests)))
    return run


def run_file(out: Path, label: str, load: float, repeat: int) -> Path:
    """Where a sweep at `out` keeps one run's summary and requests (RunFile)."""
    return out / "runs" / f"{label}-x{load:g}-{repeat}.json"


def describe(run: SweepRun) -> str:
    """One line per run, as the sweep goes."""
    s = run.summary
    att = "" if run.attainment is None else f", attainment {run.attainment:.1%}"
    step = ("" if run.speed is None else
            f", step {run.speed.step_s * 1000:.2f} ms at batch {run.speed.batch:g}, stalls "
            f"{run.speed.stalls} ({run.speed.stall_s:.1f} s, longest "
            f"{run.speed.longest_stall_s:.2f} s)")
    if run.engine_speed is not None:
        step += (f", engine's own step {run.engine_speed.step_s * 1000:.2f} ms at batch "
                 f"{run.engine_speed.batch:g}")
    cpu = f"; {run.cpu.describe()}" if run.cpu else ""
    return (f"{run.system:>20} @ {run.load:g}x ({run.rate:.3g} req/s) #{run.repeat + 1}: "
            f"TTFT {s.mean_ttft * 1000:.0f} / p99 {s.p99_ttft * 1000:.0f} ms, "
            f"TPOT {s.mean_tpot * 1000:.2f} ms, JCT {s.mean_jct:.2f} / p99 {s.p99_jct:.2f} s"
            f"{att}, refused {run.refused:g}, preemptions engine {run.engine_preemptions:g} "
            f"lengthwise {run.policy_preemptions:g}{step}{cpu}{describe_waits(run.waits)}")


def finish(results: SweepResults, out: Path) -> str:
    """The figures over repetitions, OUT/sweep.json, OUT/summary.md and the plots; the
    summary's text."""
    from bench.sweep_plots import plot_sweep

    baseline = results.systems[0]
    results.points = points(results.runs)
    results.capacities = capacities(results.runs)
    results.pairs = pairs(results.runs, baseline)
    results.adjusted = at_equal_speed(results.runs, baseline)
    results.paired = paired_loads(results.runs, baseline)
    (out / "sweep.json").write_bytes(msgspec.json.encode(results))
    text = summary_text(results)
    (out / "summary.md").write_text(text)
    plot_sweep(results.points, results.capacities, out, results.capacity_rps, results.runs,
               baseline)
    return text


def _objectives(results: SweepResults) -> str:
    parts = [f"{name} <= {value * 1000:g} ms" for name, value in
             (("TTFT", results.slo_ttft), ("TPOT", results.slo_tpot)) if value is not None]
    if not parts:
        return "no objectives (no attainment, no SLO capacity)"
    sent = "sent with every request as llm-d's headers" if results.slo else "judged only"
    if results.slo and results.slo_exempt:
        sent += f"; none sent to {', '.join(results.slo_exempt)}"
    return f"objectives {' and '.join(parts)} ({sent})"


def summary_text(results: SweepResults) -> str:
    """What the sweep prints at its end and writes to OUT/summary.md."""
    from bench import sweep_report as report

    baseline, spec = results.systems[0], results.workload
    text = [f"# bench sweep: {', '.join(results.systems)} on {results.model}\n",
            (f"Load 1.0 = {results.capacity_rps:.3g} req/s ({results.capacity_how}). "
            f"{spec.num} requests per run ({results.sample} prompts, {spec.lengths}, "
            f"arrivals {spec.arrivals} CV {spec.cv:g}, outputs x{spec.scale:g} "
            f"{f'capped at {spec.cap}' if spec.cap else 'uncapped'}), max_num_seqs {results.max_num_seqs}, KV blocks "
            f"{results.kv_blocks or 'as vLLM sizes them'}; {_objectives(results)}. "
            f"{results.repeats} repetition(s), each its own draw of the workload (seed "
            f"{spec.seed} + repetition), the same for every system: medians (min–max). "
            f"{_client(results)}.\n"),
            "## Per load\n", report.points_table(results.points),
            f"## Against {baseline} (ratios of medians)\n",
            report.ratio_table(results.points, baseline)]
    if results.capacities:
        text += ["## SLO capacity (highest load with >= 90 % attainment, interpolated)\n",
                 report.capacity_table(results.capacities, baseline, results.capacity_rps)]
    if refusals := report.refusals_table(results.runs):
        text += ["## Refusals, and what shadow mode says of them\n",
                 ("A request lengthwise refuses (429) counts as a miss in attainment. A "
                 "system run with `[slo] enforce = false` refuses nothing: it counts the "
                 "requests it would have refused and whether, served, they met their "
                 "objective (precision: the share that missed, so that refusing them was "
                 "right).\n"),
                 refusals]
    if results.paired:
        text += [f"## Against {baseline}, pair by pair\n",
                 ("Each repetition runs every system on the same draw of the workload, one "
                 "after the other: a pair's ratio is the scheduler's (and the machine's of "
                 "that moment). Geometric mean of the pairs' ratios (min–max); where a "
                 "pair's engine speeds differ by more than 10 % (flagged), also the mean "
                 "over the others.\n"),
                 report.paired_table(results.paired, baseline)]
    if results.pairs:
        source = ("the engines' own step lines (--step-log)"
                  if any(run.engine_speed for run in results.runs)
                  else "the client's token times")
        text += [f"## Engine speed: step time against {baseline}'s in the same pair\n",
                 f"At matched batch sizes, from {source}.\n",
                 report.pairs_table(results.pairs, baseline)]
    if results.adjusted:
        text += [f"## Paired ratios to {baseline} at equal engine speed\n",
                 ("Each figure's ratio over the pairs of a load band (geometric mean), and "
                 "the same read at equal engine speed: the intercept of log ratio on log "
                 "step-time ratio, +-2 standard errors (bench/sweepstats.py, "
                 "at_equal_speed). A scheduler that changes the step time itself (fewer "
                 "preemptions: fewer recompute prefills among the decode steps) has that "
                 "gain read as the machine's; where a band's pairs all lean one way the "
                 "intercept is an extrapolation (wide bounds).\n"),
                 report.adjusted_table(results.adjusted, baseline)]
    return "\n".join(text)
