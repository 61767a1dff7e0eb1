"""Simulated vs real: replay the workload of every lengthwise run of a `bench compare`
results.json in the simulator (same prompts and lengths, the arrival times the run's client
actually sent, the same policy, overrides, admission and KV blocks) on a cost profile, and
report the relative error of mean and p99 JCT.

    python -m bench.validate --results OUT/results.json [--profile bench/profiles/X.json]

The profile is each run's own learned clock (compare saves it at the end of every lengthwise
run, OUT/learned/) unless --profile names one for all. vLLM's own server is replayed too
(with --profile: it learns no clock) as lengthwise fcfs handing every request to the engine.

What-ifs on the same arrivals: `--systems lengthwise:ssjf,lengthwise:fcfs+scheduler.backfill=false`
replays the first run at each rate as each of these systems instead, `--clock-scale 1.25`
slows every step of the profile (near capacity a few per cent of engine speed is a factor
in latency: docs/benchmarks.md), and `--load 1.5` sends the same requests 1.5x as fast
(a run at capacity replayed in overload; the real columns stay the run's own). The table
gives the simulated engine's preemptions beside the real ones. A run whose requests carried an
objective (`compare --send-slo`) is replayed with it: the simulated core refuses as the
daemon does, and the table adds the requests refused and the goodput, real and simulated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from bench import compare, costfile, vllm_client, workload
from bench.compare import CompareResults
from bench.metrics import summarize
from bench.sim import SimOptions, predictions, simulate
from bench.sim.overrides import build_config, build_sim, split_sim
from daemon.core.job import Slo


class Row(msgspec.Struct, kw_only=True):
    system: str
    rate: float
    real_mean_jct: float
    sim_mean_jct: float
    real_p99_jct: float
    sim_p99_jct: float
    real_preemptions: float | None = None  # the engine's, as /metrics counted them
    sim_preemptions: int = 0
    real_jct: list[float] = msgspec.field(default_factory=list)  # per request, for the plot
    sim_jct: list[float] = msgspec.field(default_factory=list)
    # Runs whose requests carried an objective (--send-slo): requests refused, and goodput
    # (requests meeting it per second), real and simulated; None without one.
    refused: tuple[int, int] | None = None
    goodput: tuple[float, float] | None = None

    @property
    def mean_error(self) -> float:
        return self.sim_mean_jct / self.real_mean_jct - 1

    @property
    def p99_error(self) -> float:
        return self.sim_p99_jct / self.real_p99_jct - 1


def _predictor_for(policy: str, predictor: str) -> str:
    """The daemon predicts every job, fcfs's too: memory admission reads the predictions."""
    return "oracle" if policy.startswith("oracle") else predictor


VLLM_CPU_BLOCK_TOKENS = 128  # vLLM's CPU backend's KV block: --kv-blocks count these


def _overrides(results: CompareResults, system: str) -> list[str]:
    """The simulated daemon's settings for one system of the comparison. vLLM's own server
    is lengthwise fcfs handing every request to the engine at once (max_running =
    max_num_seqs, no memory admission): the simulated engine's queue and recompute
    preemption do the rest, as vLLM's scheduler does."""
    if system == "vllm":
        policy, sets, running = "fcfs", [], str(results.max_num_seqs)
    else:
        policy, *sets = system.partition(":")[2].split("+")
        running = str(results.max_running)
    out = [f"scheduler.policy={policy}", f"scheduler.max_running={running}",
           f"engine.max_num_seqs={results.max_num_seqs}",
           f"sim.kv_block_tokens={VLLM_CPU_BLOCK_TOKENS}", *sets]
    if results.kv_blocks:  # the engine reports one block fewer than the override
        out.append(f"sim.kv_capacity_tokens={(results.kv_blocks - 1) * VLLM_CPU_BLOCK_TOKENS}")
    return out


def _as_sent(requests: list[workload.Request], run_requests: list, client: str,
             salt: str) -> list[workload.Request]:
    """The workload as the run's client sent it: the arrival times it recorded (vLLM's
    client draws its own), and the prompts the daemon's predictor read, salted as compare
    salts each rate (ours: the first message; vLLM's client: one user message of every
    turn joined, bench/vllm_client.py)."""
    sent = {q.index: q.arrival_s for q in run_requests}
    out = []
    for r in requests:
        if client == "vllm":
            messages = [workload.Message("user", vllm_client.as_prompt(r, salt))]
        else:
            messages = [msgspec.structs.replace(m, content=salt + m.content) if k == 0 else m
                        for k, m in enumerate(r.messages)]
        out.append(msgspec.structs.replace(r, arrival_s=sent.get(r.index, r.arrival_s),
                                           messages=messages))
    return out


_STEP_COSTS = ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s",
               "decode_per_context_token_s")


def what_if(results: CompareResults, systems: list[str]) -> CompareResults:
    """The first run at each rate, replayed as each of `systems` (same arrivals). A run
    of lengthwise goes first: it carries a learned clock, vLLM's server's does not."""
    firsts = {run.rate: run for run in reversed(results.runs)}
    firsts.update({run.rate: run for run in reversed(results.runs) if run.learned_profile})
    runs = [msgspec.structs.replace(run, system=system)
            for run in firsts.values() for system in systems]
    return msgspec.structs.replace(results, runs=runs)


def slowed(profile: costfile.Profile, scale: float) -> costfile.Profile:
    """The profile with every step `scale` x as long."""
    sim = msgspec.structs.replace(profile.sim, **{
        name: getattr(profile.sim, name) * scale for name in _STEP_COSTS})
    return msgspec.structs.replace(profile, sim=sim)


def validate(results: CompareResults, profile: costfile.Profile | None,
             predictor: str, clock_scale: float = 1.0, load: float = 1.0) -> list[Row]:
    rows = []
    rates = list(dict.fromkeys(run.rate for run in results.runs))  # in the order compare ran them
    for run in results.runs:
        kind, _, rest = run.system.partition(":")
        if kind != "lengthwise" and run.system != "vllm":
            continue
        policy = rest.split("+")[0] if kind == "lengthwise" else "fcfs"
        spec = msgspec.structs.replace(results.workload, rate=run.rate)
        requests = [msgspec.structs.replace(r, arrival_s=r.arrival_s / load) for r in _as_sent(
            workload.build(spec), run.requests, results.client, compare.salt(rates.index(run.rate)))]
        config_sets, sim_sets = split_sim(_overrides(results, run.system))
        config = build_config(overrides=config_sets)
        if profile is None and not run.learned_profile:  # vLLM's server learns no clock
            continue
        used = slowed(profile or costfile.load(run.learned_profile), clock_scale)
        opts = SimOptions(config=config, sim=build_sim(used.sim, sim_sets),
                          natural=results.natural, max_model_len=spec.max_model_len,
                          slo=results.slo)
        estimates = predictions(requests, _predictor_for(policy, predictor), spec.seed,
                                config.scheduler.admission_quantile)
        outcome = simulate(requests, estimates, opts)
        simulated = outcome.results
        slo = results.slo or Slo()  # run.summary was taken against the same objective
        sim = summarize(simulated, slo.ttft_s, slo.tpot_s)
        rows.append(Row(system=run.system, rate=run.rate * load,
                        real_mean_jct=run.summary.mean_jct,
                        sim_mean_jct=sim.mean_jct, real_p99_jct=run.summary.p99_jct,
                        sim_p99_jct=sim.p99_jct, real_preemptions=run.engine_preemptions,
                        sim_preemptions=outcome.engine_preemptions,
                        real_jct=[q.jct_s for q in run.requests if q.ok],
                        sim_jct=[q.jct_s for q in simulated if q.ok],
                        refused=None if results.slo is None else (run.summary.n_failed,
                                                                  sim.n_failed),
                        goodput=None if results.slo is None else (run.summary.goodput_rps,
                                                                  sim.goodput_rps)))
    return rows


def table(rows: list[Row]) -> str:
    slo = any(r.refused is not None for r in rows)
    head = ("| system | rate | real mean JCT (s) | sim mean JCT (s) | error | real p99 (s) "
            "| sim p99 (s) | error | engine preemptions: real | sim |")
    if slo:
        head += " refused: real | sim | goodput (req/s): real | sim |"
    lines = [head, "|---" * head.count(" | ") + "|---|"]
    for r in rows:
        real = "-" if r.real_preemptions is None else f"{r.real_preemptions:g}"
        line = (f"| {r.system} | {r.rate:g} | {r.real_mean_jct:.2f} | {r.sim_mean_jct:.2f} "
                f"| {r.mean_error:+.1%} | {r.real_p99_jct:.2f} | {r.sim_p99_jct:.2f} "
                f"| {r.p99_error:+.1%} | {real} | {r.sim_preemptions} |")
        if slo:
            refused, goodput = r.refused or (0, 0), r.goodput or (0.0, 0.0)
            line += (f" {refused[0]} | {refused[1]} | {goodput[0]:.2f} | {goodput[1]:.2f} |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.validate", description=__doc__)
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--profile", type=Path,
                   help="one cost profile for every run (default: each run's learned clock)")
    p.add_argument("--predictor", default="predictor/models/default",
                   help="predictor the daemon ran with (for non-oracle length policies)")
    p.add_argument("--systems", help="comma list: replay the first run at each rate as these "
                   "systems instead (lengthwise:POLICY+KEY=V, vllm)")
    p.add_argument("--clock-scale", type=float, default=1.0,
                   help="every simulated step this many times as long")
    p.add_argument("--load", type=float, default=1.0,
                   help="send the requests this many times as fast (arrival times / LOAD; "
                   "the real columns stay the run's own, at its rate)")
    p.add_argument("--out", type=Path, help="write the markdown table here too")
    p.add_argument("--plot", type=Path, help="PNG: real and simulated JCT CDFs, per run")
    args = p.parse_args(argv)
    results = msgspec.json.decode(args.results.read_bytes(), type=CompareResults)
    if args.systems:
        results = what_if(results, args.systems.split(","))
    rows = validate(results, costfile.load(args.profile) if args.profile else None,
                    args.predictor, args.clock_scale, args.load)
    text = table(rows)
    if args.out:
        args.out.write_text(text)
    if args.plot:
        from bench.plots import plot_sim_vs_real

        plot_sim_vs_real([(f"{r.system.partition(':')[2]} @ {r.rate:g} req/s", r.real_jct,
                           r.sim_jct) for r in rows], args.plot)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
