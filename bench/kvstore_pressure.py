"""alise under KV memory pressure on the real engine: offload to kvstore vs drop vs vLLM.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kvstore_pressure --reps 3

Three systems (--systems), each on the same engine settings: model, dtype, max_num_seqs
(= the daemon's max_running), prefix caching on, the same cores for the engine's threads
(--cpu-bind), the same KV GiB and a KV cache cut to --blocks blocks
(num_gpu_blocks_override), so a preempted job's blocks are soon evicted from vLLM's
prefix cache. `offload` and `drop` are the real daemon (`lengthwise serve`)
with alise and max_resident_jobs = 0 (every preempted job is offloaded or dropped),
aging's wait bound relaxed to 50 typical service times (--slowdown; the shipped 4 bounds
the long jobs' waits sooner):
`offload`: [kvstore] enabled, alise offload = true; `drop`: kvstore enabled but offload =
false (equal connector overhead, nothing saved). `vllm` is vLLM's own OpenAI server (FCFS,
its own recompute preemption under memory pressure). Workload: --long jobs with long
prompts and long outputs arrive first, then --short jobs with long prompts and short
outputs at --gap-s intervals, so alise preempts the long ones. Prompts are random token
ids (lengths are what matters); every output length is forced (ignore_eos + max_tokens)
and no predictor runs (each job's budget caps the fallback estimate, so alise sees the
true lengths). Each repetition runs every system once on the same workload, in an order
rotated per repetition. Prints per system and repetition mean / p99 JCT, the daemon's
preemptions and resumes, vLLM's engine preemptions (vllm:num_preemptions_total), and the
share of resumed context that was prefilled again: over all resumes (`recomputed_share`)
and over the resumes of jobs whose KV was offloaded (`offloaded_share`, the metrics'
kv="offloaded" samples; nan for `drop`); n/a where a system has no such figure. Last, per
system, the median (min-max) over repetitions of mean and p99 JCT. Also the mean JCT of
the long and of the short jobs.

The SmolLM2 workload of docs/kvstore.md section 6 (long jobs with 1,400-1,700-token
prompts, KV for two of them, preemptions up to 8 per job; a short job every 3 s preempts
a long one, every 1.5 s seldom does):

    PYTHONPATH=$PWD .venv/bin/python -m bench.kvstore_pressure --reps 3 \
        --model models/smollm2-135m-instruct --dtype bfloat16 \
        --profile bench/profiles/smollm2-135m-cpu.json --blocks 32 --long 4 \
        --long-tokens 300 --prompt 1400 1700 --short 16 --short-prompt 700 1000 \
        --gap-s 3.0 --max-preemptions 8
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench import promtext
from bench.servers import Server, Settings, System, parse_system

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("offload", "drop", "vllm")
# What each run prints, in this order; "n/a" where a system has no such figure (vLLM's
# server has no resumes or kvstore, the daemon does not export its engine's preemptions).
FIGURES = ("mean_jct_s", "p99_jct_s", "long_mean_jct_s", "short_mean_jct_s",
           "preemptions_total", "engine_preemptions_total", "resume_total",
           "recomputed_share", "offloaded_share",
           "resume_context_tokens_total", "resume_recomputed_tokens_total",
           "kvstore_saved_tokens_total", "kvstore_loaded_tokens_total",
           "kvstore_evicted_tokens_total")


def parse_systems(text: str) -> list[str]:
    systems = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if not systems or unknown or len(set(systems)) != len(systems):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a comma-separated list of distinct systems of {', '.join(SYSTEMS)}")
    return systems


def rotated(systems: list[str], rep: int) -> list[str]:
    """Repetition k starts with the k-th system, so no system always runs first or last."""
    k = rep % len(systems)
    return systems[k:] + systems[:k]


def _alise_toml(args: argparse.Namespace, offload: bool) -> str:
    return f"""
[scheduler.aging]
slowdown = {args.slowdown}
[policies.alise]
offload = {str(offload).lower()}
max_resident_jobs = 0
max_preemptions = {args.max_preemptions}
[kvstore]
enabled = true
quantization = "{args.quantization}"
capacity_bytes = {args.capacity_mib << 20}
[predictor]
path = "none"
iterative_path = "none"
[costmodel]
profile = "{args.profile}"
"""


def system(args: argparse.Namespace, name: str) -> tuple[System, Settings]:
    """The daemon with alise (offload or drop), or vLLM's own server, on the same engine
    settings: model, dtype, max_num_seqs, KV GiB and the KV cut, prefix caching on, the same
    cores for the engine's threads."""
    settings = Settings(model=Path(args.model), dtype=args.dtype, max_num_seqs=args.max_running,
                        max_running=str(args.max_running),  # by count: its measured setting
                        max_model_len=args.max_model_len,
                        num_gpu_blocks_override=args.blocks, cpu_bind=args.cpu_bind,
                        startup_timeout_s=900.0,  # a spawned engine: minutes on a busy host
                        extra_toml="" if name == "vllm" else _alise_toml(args, name == "offload"))
    return parse_system("vllm" if name == "vllm" else "lengthwise:alise"), settings


def _metric(base: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples, of those carrying `labels` (kv="offloaded") if given."""
    return promtext.total(httpx.get(base + "/metrics", timeout=10).text, name, **labels)


async def _one(client: httpx.AsyncClient, base: str, model: str, prompt: list[int],
               max_tokens: int, delay_s: float) -> float:
    await asyncio.sleep(delay_s)
    start = time.monotonic()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    response = await client.post(base + "/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    jct = time.monotonic() - start
    generated = response.json()["usage"]["completion_tokens"]
    if generated != max_tokens:  # every system must run each job to its forced length
        raise RuntimeError(f"{base}: {generated} tokens generated, {max_tokens} forced")
    return jct


async def _load(base: str, args: argparse.Namespace, seed: int) -> list[float]:
    rng = random.Random(seed)
    jobs = []
    for i in range(args.long + args.short):
        long = i < args.long
        lengths = args.prompt if long else (args.short_prompt or args.prompt)
        prompt = [rng.randrange(200, 40000) for _ in range(rng.randrange(*lengths))]
        delay = 0.0 if long else args.lead_s + (i - args.long) * args.gap_s
        jobs.append((prompt, args.long_tokens if long else args.short_tokens, delay))
    async with httpx.AsyncClient() as client:
        model = (await client.get(base + "/v1/models")).json()["data"][0]["id"]
        return list(await asyncio.gather(*(_one(client, base, model, p, n, d)
                                           for p, n, d in jobs)))


def _figures(base: str) -> dict[str, float]:
    figures = {name: _metric(base, f"lengthwise_{name}") for name in (
        "preemptions_total", "resume_total", "resume_context_tokens_total",
        "resume_recomputed_tokens_total", "kvstore_saved_tokens_total",
        "kvstore_loaded_tokens_total", "kvstore_evicted_tokens_total")}
    offloaded = {name: _metric(base, f"lengthwise_{name}", kv="offloaded") for name in (
        "resume_context_tokens_total", "resume_recomputed_tokens_total")}

    def share(counts: dict[str, float]) -> float:
        context = counts["resume_context_tokens_total"]
        return counts["resume_recomputed_tokens_total"] / context if context else float("nan")

    return {**figures, "recomputed_share": share(figures), "offloaded_share": share(offloaded)}


def run_system(args: argparse.Namespace, name: str, seed: int, folder: Path) -> dict[str, float]:
    server = Server(*system(args, name), folder)
    try:
        server.wait_ready()
        jct = asyncio.run(_load(server.base_url, args, seed))
        time.sleep(1.0)  # the engine's last stats
        if name == "vllm":
            figures = {"engine_preemptions_total": _metric(server.base_url,
                                                           "vllm:num_preemptions_total")}
        else:
            figures = _figures(server.base_url)
    finally:
        server.stop(120)
    return {"mean_jct_s": statistics.fmean(jct), "p99_jct_s": float(np.percentile(jct, 99)),
            "long_mean_jct_s": statistics.fmean(jct[:args.long]),  # _load: long jobs first
            "short_mean_jct_s": statistics.fmean(jct[args.long:]) if args.short else math.nan,
            **figures}


def row(rep: int, name: str, result: dict[str, float]) -> str:
    return f"rep {rep} {name:7s} " + " ".join(
        f"{key}={result[key]:.3g}" if key in result else f"{key}=n/a" for key in FIGURES)


def summary(results: dict[str, list[dict[str, float]]]) -> list[str]:
    """Per system: median (min-max) over repetitions of mean and p99 JCT."""
    lines = []
    for name, runs in results.items():
        cells = []
        for key in ("mean_jct_s", "p99_jct_s"):
            values = [run[key] for run in runs]
            cells.append(f"{key}={statistics.median(values):.3g} "
                         f"({min(values):.3g}-{max(values):.3g})")
        lines.append(f"median of {len(runs)} {name:7s} " + " ".join(cells))
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", type=parse_systems, default=list(SYSTEMS),
                        help="comma-separated, of " + ",".join(SYSTEMS) + " (default: all)")
    parser.add_argument("--model", default=str(ROOT / "models" / "tiny-llama"))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--profile",
                        default=str(ROOT / "bench" / "profiles" / "tiny-llama-cpu-stack.json"))
    parser.add_argument("--blocks", type=int, default=24,
                        help="KV blocks of 128 tokens (vLLM needs >= max-model-len / 128)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-running", type=int, default=2)
    parser.add_argument("--cpu-bind", default=",".join(map(str, sorted(os.sched_getaffinity(0)))),
                        help="cores for every engine's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND;"
                        " default: all this process may use, as the daemon's engine with the"
                        " kvstore connector gets; vLLM's server would keep one free)")
    parser.add_argument("--quantization", default="none", choices=["none", "int8"])
    parser.add_argument("--capacity-mib", type=int, default=512)
    parser.add_argument("--long", type=int, default=4)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--prompt", type=int, nargs=2, default=[700, 1000],
                        help="prompt tokens [lo, hi) of the long jobs, and of the short"
                        " ones unless --short-prompt")
    parser.add_argument("--short-prompt", type=int, nargs=2,
                        help="prompt tokens [lo, hi) of the short jobs (default: --prompt)")
    parser.add_argument("--slowdown", type=float, default=50.0,
                        help="[scheduler.aging] slowdown of the daemon (shipped: 4; 50 leaves"
                        " alise's order to itself)")
    parser.add_argument("--max-preemptions", type=int, default=2,
                        help="alise's max_preemptions per job (its default: 2)")
    parser.add_argument("--long-tokens", type=int, default=400)
    parser.add_argument("--short-tokens", type=int, default=16)
    parser.add_argument("--lead-s", type=float, default=1.0)
    parser.add_argument("--gap-s", type=float, default=0.3)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--logs", type=Path,
                        help="keep each run's server log here (default: deleted)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.systems}
    with tempfile.TemporaryDirectory(prefix="kvpressure-") as scratch:
        for rep in range(args.reps):
            for name in rotated(args.systems, rep):  # same workload for each per repetition
                folder = (args.logs or Path(scratch)) / f"rep{rep}-{name}"
                folder.mkdir(parents=True, exist_ok=True)
                results[name].append(run_system(args, name, seed=rep, folder=folder))
                print(row(rep, name, results[name][-1]), flush=True)
    print("\n".join(summary(results)))


if __name__ == "__main__":
    main()
