"""`lengthwise bench compare`: every system in turn, the identical workload at each rate.

With `--repeats N` the systems alternate within each repetition (A B C, A B C, ...: a slow
spell of the machine hits every system, not one), each started afresh.
Writes OUT/results.json (every run: the summary and per-request results; per system and
rate: the median with min-max of each metric), OUT/results.md (the table of medians) and
OUT/*.png (JCT CDF, mean and p99 JCT vs rate, throughput vs rate; medians). Systems run one
at a time: on a shared CPU, two engines would measure each other.
"""

from __future__ import annotations

import argparse
import math
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import msgspec

from bench import workload
from bench.client import ClientOptions
from bench.hostload import CpuMeter, CpuShare
from bench.learned import Sampler
from bench.metrics import (
    HEADLINE,
    RequestResult,
    Spread,
    Summary,
    median_summary,
    spread,
    summarize,
)
from bench.servers import Server, Settings, System, describe_waits, parse_system
from daemon.core.job import Slo

WARM_UP_REQUESTS, WARM_UP_RATE = 8, 50.0  # a short burst before the measured rates
BACKLOG_RATE = 1e6  # our client's stand-in for "every request at once"
QUICK_SYSTEMS = "vllm,vllm-priority,lengthwise:fcfs,lengthwise:ssjf,lengthwise:oracle-sjf"


class RunRecord(msgspec.Struct, kw_only=True):
    system: str
    rate: float
    summary: Summary
    requests: list[RequestResult]
    wall_s: float
    cpu: CpuShare | None = None  # who used the machine's CPU during the run
    repeat: int = 0  # which repetition (0-based)
    # During the run: the engine's own preemptions (its KV cache ran out: vLLM's
    # vllm:num_preemptions_total) and lengthwise's policy preemptions (0 for vLLM).
    engine_preemptions: float = 0.0
    policy_preemptions: float = 0.0
    server_refused: float = 0.0  # requests the server answered 429 (lengthwise's /metrics)
    waits: dict[str, float] = {}  # lengthwise's account of its waits (servers.Counters)
    # lengthwise: the cost profile its clock learned over the run (the mean of snapshots
    # taken every few seconds: bench/learned.py; a file under OUT/learned/, beside
    # STEM-end.json, the clock at the run's end), which `python -m bench.validate` simulates
    # the run on.
    learned_profile: str = ""


class Aggregate(msgspec.Struct, kw_only=True):
    """One (system, rate) over its repetitions: field-by-field medians, and min-max of the
    headline metrics. `requests` pools every repetition's (for the CDF plot)."""

    system: str
    rate: float
    repeats: int
    summary: Summary
    spread: dict[str, Spread]
    requests: list[RequestResult] = []
    engine_preemptions: Spread | None = None  # median (min-max) over repetitions
    policy_preemptions: Spread | None = None
    server_refused: Spread | None = None  # 429s as the server counted them


class CompareResults(msgspec.Struct, kw_only=True):
    model: str
    max_num_seqs: int
    workload: workload.WorkloadSpec  # rate is per run (see runs)
    natural: bool
    startup_s: dict[str, list[float]]  # per system, one per repetition
    runs: list[RunRecord]
    sample: str = ""  # the prompts: held-out | in-sample | reserved-test | external
    repeats: int = 1
    client: str = "ours"  # ours | vllm (vLLM's `vllm bench serve`)
    capacity_rps: float = 0.0  # vLLM's server under a backlog, when rates came from --load
    max_running: str = "auto"  # lengthwise's [scheduler] max_running
    kv_blocks: int = 0  # num_gpu_blocks_override of every engine (0: sized by vLLM)
    aggregates: list[Aggregate] = []
    slo: Slo | None = None  # the objective every request carried (--send-slo)


def salt(k: int) -> str:
    """What the prompts of the k-th rate start with: every rate sends the same prompts, and
    salted apart none hits the prefix cache the previous rate filled (the same salt for
    every system: same work)."""
    return f"run {k + 1}. "


def run_order(systems: list[System], repeats: int) -> list[tuple[int, System]]:
    """(repetition, system): A B C, B C A, C A B, ... never A A B B, and no system always
    in the same place of a cycle (other load on a shared machine comes and goes)."""
    n = len(systems)
    return [(k, systems[(k + i) % n]) for k in range(repeats) for i in range(n)]


def aggregate(runs: list[RunRecord]) -> list[Aggregate]:
    groups: dict[tuple[str, float], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.system, run.rate), []).append(run)
    return [Aggregate(system=system, rate=rate, repeats=len(group),
                      summary=median_summary([r.summary for r in group]),
                      spread={f: spread([r.summary for r in group], f) for f in HEADLINE},
                      requests=[q for r in group for q in r.requests],
                      engine_preemptions=_spread([r.engine_preemptions for r in group]),
                      policy_preemptions=_spread([r.policy_preemptions for r in group]),
                      server_refused=_spread([r.server_refused for r in group]))
            for (system, rate), group in groups.items()]


def _spread(values: list[float]) -> Spread:
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return Spread(median, ordered[0], ordered[-1])


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from bench import client

    p = sub.add_parser("compare", help="start each system in turn, same workload, compare")
    p.add_argument("--systems", default=QUICK_SYSTEMS,
                   help="comma list of vllm | vllm-priority | lengthwise:POLICY")
    # The tiny engine serves ~9.5 req/s of these lengths on 2 cores: 5, 7, 9 is about half,
    # three quarters and nearly all of its capacity (docs/benchmarks.md).
    p.add_argument("--rates", default="5,7,9", help="comma list of request rates (req/s)")
    add_engine_arguments(p)
    p.add_argument("--repeats", type=int, default=1,
                   help="run every (system, rate) N times, systems alternating")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--client", choices=("ours", "vllm"), default="ours",
                   help="load client: ours (bench/client.py) or vLLM's own `vllm bench serve` "
                        "(single-turn workloads; Gamma arrivals drawn by vLLM's client)")
    p.add_argument("--load", type=str, default="",
                   help="comma list of loads as shares of the capacity vLLM's server shows "
                        "in this run (a backlog of --num requests, measured first with the "
                        "same client); replaces --rates")
    client.add_arguments(p)
    workload.add_arguments(p)
    p.set_defaults(func=run_compare, num=150, cap=256)


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The engine settings every system gets alike (compare, sweep)."""
    p.add_argument("--model", type=Path, default=Path("models/tiny-llama"))
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--kv-blocks", type=int, default=0,
                   help="KV cache blocks per engine (num_gpu_blocks_override, for every "
                        "system): memory pressure; 0 = sized from the 1 GiB cache")
    p.add_argument("--max-running", default="auto",
                   help='lengthwise\'s [scheduler] max_running: "auto" (memory admission, '
                        "the daemon's default) or a number")
    p.add_argument("--extra-toml", type=Path, help="TOML appended to lengthwise configs")
    p.add_argument("--engine-kind", choices=("vllm", "sim"), default="vllm",
                   help="lengthwise's engine; sim: the simulated one (tests of the harness: "
                        "lengthwise systems only, at given rates or --capacity)")
    p.add_argument("--step-log", action="store_true",
                   help="every engine logs each step's batch and time in its server's log "
                        "(vLLM's enable_logging_iteration_details): the engines' own speed")
    p.add_argument("--trace", action="store_true",
                   help="lengthwise writes each admission forecast, launch and stop to "
                        "OUT/LABEL[-REPEAT].trace.jsonl: `python -m bench.forecasterrors "
                        "OUT` replays the forecasts with the services that came true")


def check_engine_kind(args: argparse.Namespace, systems: list[System],
                      measures_capacity: bool) -> None:
    """The simulated engine serves lengthwise's systems only, and vLLM's server cannot
    measure the capacity for it."""
    if args.engine_kind == "sim" and (any(s.kind == "vllm" for s in systems)
                                      or measures_capacity):
        raise SystemExit("--engine-kind sim runs lengthwise systems only, with --capacity "
                         "(sweep) or --rates (compare)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(model=args.model.resolve(), max_num_seqs=args.max_num_seqs,
                    max_running=args.max_running, num_gpu_blocks_override=args.kv_blocks,
                    max_model_len=args.max_model_len, trust_budget=args.natural,
                    extra_toml=args.extra_toml.read_text() if args.extra_toml else "",
                    engine_kind=args.engine_kind, step_log=args.step_log,
                    trace=args.trace)


def _run_system(system: System, settings: Settings, args: argparse.Namespace,
                rates: list[float], out: Path, repeat: int) -> tuple[float, list[RunRecord]]:
    server = Server(system, settings, out)
    records = []
    try:
        startup = server.wait_ready()
        warm_up(server, system, args)
        for k, rate in enumerate(rates):
            opts = run_options(system, args, salt(k))
            record = measure_run(server, system, args, rate, opts, out, repeat)
            records.append(record)
            summary, cpu = record.summary, record.cpu
            print(f"{system.spec:>24} @ {rate:g} req/s #{repeat + 1}: mean JCT {summary.mean_jct:.2f} s, "
                  f"p99 {summary.p99_jct:.2f} s, TTFT {summary.mean_ttft:.2f} s, "
                  f"{summary.throughput_tps:.0f} tok/s, goodput {summary.goodput_rps:.2f} req/s, "
                  f"preemptions engine {record.engine_preemptions:g} "
                  f"policy {record.policy_preemptions:g}, "
                  f"{summary.n_failed} failed ({summary.n_refused} x 429{_refusal_times(summary)}"
                  f"{_server_refused(record.server_refused, summary)}); "
                  f"{cpu.describe() if cpu else ''}{describe_waits(record.waits)}", flush=True)
            if cpu is not None:
                cpu.warn_if_contaminated("during this run")
    finally:
        server.stop()
    return startup, records


def run_options(system: System, args: argparse.Namespace, run_salt: str) -> ClientOptions:
    """What the client sends in one measured run: the run's salt, --send-slo's headers."""
    from bench import client

    return ClientOptions(natural=args.natural, priority=system.client_priority,
                         max_model_len=args.max_model_len, salt=run_salt,
                         headers=client.slo_headers(args, system.spec))


def warm_up(server: Server, system: System, args: argparse.Namespace) -> None:
    """An unmeasured burst first: first-call costs (allocators, kernel selection, the
    predictor's first forward) belong to no rate, and every system pays them here."""
    from bench import client

    opts = ClientOptions(natural=args.natural, priority=system.client_priority,
                         max_model_len=args.max_model_len, salt="warm-up. ")
    requests = workload.build(workload.spec_from_args(args, rate=WARM_UP_RATE))
    client.run(server.base_url, requests[:WARM_UP_REQUESTS], opts, progress=False)


def run_tag(system: System, rate: float, repeat: int) -> str:
    """The file stem of one run's client and clock files."""
    return f"{system.label}-{rate:g}-{repeat}"


def measure_run(server: Server, system: System, args: argparse.Namespace, rate: float,
                opts: ClientOptions, out: Path, repeat: int, tag: str = "") -> RunRecord:
    """One measured run on a started, warmed server: the workload at `rate` with the
    chosen client, the server's counters and (lengthwise) its learned clock over the run,
    and who used the CPU meanwhile."""
    tag = tag or run_tag(system, rate, repeat)
    started, meter = time.perf_counter(), CpuMeter(server.proc.pid)
    before = server.counters()
    with _clock_sampler(server, system) as sampler:
        results = _drive(server, args, rate, opts, out / "vllm-client", tag)
    cpu = meter.stop()
    counted = server.counters() - before
    return RunRecord(system=system.spec, rate=rate,
                     summary=summarize(results, args.slo_ttft, args.slo_tpot),
                     requests=results, wall_s=time.perf_counter() - started, cpu=cpu,
                     repeat=repeat, engine_preemptions=counted.engine_preemptions,
                     policy_preemptions=counted.policy_preemptions,
                     learned_profile=_save_clock(sampler, out / "learned", tag),
                     server_refused=counted.refused, waits=counted.waits)


def _server_refused(refused: float, summary: Summary) -> str:
    """", the server refused 110" where the server counted 429s the client did not see as
    such (vLLM's client records a 429 without a reason phrase in its status line, as
    hypercorn sent it, as an empty error)."""
    return f", the server refused {refused:g}" if refused != summary.n_refused else ""


def _refusal_times(summary: Summary) -> str:
    """", 429 after 12 ms median / 40 ms p99" where the client timed the refusals."""
    if summary.p50_refusal_s is None or summary.p99_refusal_s is None:
        return ""
    return (f", 429 after {summary.p50_refusal_s * 1000:.0f} ms median / "
            f"{summary.p99_refusal_s * 1000:.0f} ms p99")


def _clock_sampler(server: Server, system: System) -> AbstractContextManager[Sampler | None]:
    """Samples a lengthwise server's learned clock during a run (bench/learned.py)."""
    if system.kind != "lengthwise":
        return nullcontext()
    return Sampler(server.base_url, "")


def _save_clock(sampler: Sampler | None, folder: Path, stem: str) -> str:
    """The learned clock of a lengthwise run as cost profile files: STEM.json, the mean over
    the run, which `python -m bench.validate` simulates the run on, and STEM-end.json, the
    clock at its end. "" for vLLM, or when nothing was learned."""
    if sampler is None:
        return ""
    from bench import costfile

    folder.mkdir(parents=True, exist_ok=True)
    try:
        mean = sampler.profile()
    except ValueError as exc:
        print(f"no learned clock: {exc}", flush=True)
        return ""
    costfile.save(msgspec.structs.replace(mean, name=stem), folder / f"{stem}.json")
    costfile.save(msgspec.structs.replace(sampler.snapshots[-1], name=f"{stem}-end"),
                  folder / f"{stem}-end.json")
    return str(folder / f"{stem}.json")


def _drive(server: Server, args: argparse.Namespace, rate: float, opts: ClientOptions,
           work_dir: Path, tag: str) -> list[RequestResult]:
    """One measured run at `rate` (inf: the whole workload at once) with the chosen client."""
    from bench import client, vllm_client

    requests = workload.build(workload.spec_from_args(
        args, rate=BACKLOG_RATE if math.isinf(rate) else rate))
    if args.client == "ours":
        return client.run(server.base_url, requests, opts)
    return vllm_client.run(server.base_url, requests, work_dir, tag, rate=rate,
                           cv=args.cv if args.arrivals == "gamma" else 1.0, seed=args.seed,
                           natural=args.natural, salt=opts.salt, tokenizer=args.model,
                           max_model_len=args.max_model_len, headers=opts.headers)


def measure_capacity(settings: Settings, args: argparse.Namespace, out: Path) -> float:
    """Completed req/s of vLLM's own server under a backlog of the workload, fresh start."""
    server = Server(parse_system("vllm"), settings, out)
    try:
        server.wait_ready()
        opts = ClientOptions(natural=args.natural, max_model_len=args.max_model_len,
                             salt="capacity. ")
        results = _drive(server, args, math.inf, opts, out / "vllm-client", "capacity")
    finally:
        server.stop()
    capacity = summarize(results).throughput_rps
    print(f"vLLM's server completes {capacity:.3g} req/s under a backlog of {len(results)}",
          flush=True)
    return capacity


def run_compare(args: argparse.Namespace) -> int:
    from bench import client
    from bench.plots import plot_all
    from bench.report import markdown_table, ratio_table

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    systems = [parse_system(s) for s in args.systems.split(",") if s]
    if args.client == "vllm" and any(s.client_priority != "none" for s in systems):
        raise SystemExit("--client vllm cannot send a per-request priority: drop vllm-priority")
    check_engine_kind(args, systems, bool(args.load))
    settings = settings_from_args(args)
    spec = workload.spec_from_args(args)
    workload.warn_sample(spec)
    workload.build(spec)  # fail early on bad flags
    results = CompareResults(model=args.model.name, max_num_seqs=args.max_num_seqs,
                             workload=spec, natural=args.natural, startup_s={}, runs=[],
                             sample=workload.sample_label(spec), repeats=args.repeats,
                             client=args.client, max_running=args.max_running,
                             kv_blocks=args.kv_blocks, slo=client.sent_slo(args))
    if args.load:
        results.capacity_rps = measure_capacity(settings, args, out)
        rates = [round(float(x) * results.capacity_rps, 3) for x in args.load.split(",") if x]
    else:
        rates = [float(r) for r in args.rates.split(",") if r]
    for repeat, system in run_order(systems, args.repeats):
        startup, records = _run_system(system, settings, args, rates, out, repeat)
        results.startup_s.setdefault(system.spec, []).append(startup)
        results.runs += records
        (out / "results.json").write_bytes(msgspec.json.encode(results))  # survive a crash
    results.aggregates = aggregate(results.runs)
    (out / "results.json").write_bytes(msgspec.json.encode(results))
    table = markdown_table(results.aggregates) + "\n" + ratio_table(results.aggregates)
    (out / "results.md").write_text(table)
    plot_all(results.aggregates, out)
    print(table)
    return 0
