"""alise under KV memory pressure on the real engine: offload to kvstore vs drop.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kvstore_pressure --reps 1

Each system is the real daemon (`lengthwise serve`) with alise, max_resident_jobs = 0 (every
preempted job is offloaded or dropped), prefix caching on and a KV cache cut to
--blocks blocks (num_gpu_blocks_override), so a preempted job's blocks are soon evicted
from vLLM's prefix cache. `offload`: [kvstore] enabled, alise offload = true; `drop`: the
same engine with kvstore enabled but offload = false (equal connector overhead, nothing
saved). Workload: --long jobs with long prompts and long outputs arrive first, then
--short jobs with long prompts and short outputs at --gap-s intervals, so alise preempts
the long ones. Prompts are random token ids (lengths are what matters); every output
length is forced (ignore_eos + max_tokens) and no predictor runs (each job's budget caps
the fallback estimate, so alise sees the true lengths). Prints mean / p99 JCT, resumes, and
the share of resumed context that was prefilled again, per system and repetition: over all
resumes (`recomputed_share`) and over the resumes of jobs whose KV was offloaded
(`offloaded_share`, the metrics' kv="offloaded" samples; nan for `drop`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LENGTHWISE = Path(sys.executable).parent / "lengthwise"


def _config(args: argparse.Namespace, port: int, offload: bool) -> str:
    return f"""
[server]
port = {port}
[model]
path = "{args.model}"
max_model_len = 2048
dtype = "{args.dtype}"
[engine]
max_num_seqs = {args.max_running}
num_gpu_blocks_override = {args.blocks}
[scheduler]
policy = "alise"
max_running = {args.max_running}
[scheduler.aging]
slowdown = 50.0
[policies.alise]
offload = {str(offload).lower()}
max_resident_jobs = 0
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


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(config: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    path = folder / "lengthwise.toml"
    path.write_text(config)
    port = int(config.split("port = ", 1)[1].split()[0])
    log = open(folder / "daemon.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(LENGTHWISE), "serve", "--config", str(path)], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT, process_group=0)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited: see {folder / 'daemon.log'}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError("daemon not ready")


def _metric(base: str, name: str, label: str = "") -> float:
    """Sum of a metric's samples, of those with `label` (e.g. 'kv="offloaded"') if given."""
    text = httpx.get(base + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {" and label in line)


async def _one(client: httpx.AsyncClient, base: str, model: str, prompt: list[int],
               max_tokens: int, delay_s: float) -> float:
    await asyncio.sleep(delay_s)
    start = time.monotonic()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    response = await client.post(base + "/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return time.monotonic() - start


async def _load(base: str, args: argparse.Namespace, seed: int) -> list[float]:
    rng = random.Random(seed)
    jobs = []
    for i in range(args.long + args.short):
        prompt = [rng.randrange(200, 40000) for _ in range(rng.randrange(*args.prompt))]
        long = i < args.long
        delay = 0.0 if long else args.lead_s + (i - args.long) * args.gap_s
        jobs.append((prompt, args.long_tokens if long else args.short_tokens, delay))
    async with httpx.AsyncClient() as client:
        model = (await client.get(base + "/v1/models")).json()["data"][0]["id"]
        return list(await asyncio.gather(*(_one(client, base, model, p, n, d)
                                           for p, n, d in jobs)))


def run_system(args: argparse.Namespace, offload: bool, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="kvpressure-") as folder:
        proc, base = _start(_config(args, _port(), offload), Path(folder))
        try:
            jct = asyncio.run(_load(base, args, seed))
            time.sleep(1.0)  # the engine's last stats
            figures = {name: _metric(base, f"lengthwise_{name}") for name in (
                "preemptions_total", "resume_total", "resume_context_tokens_total",
                "resume_recomputed_tokens_total", "kvstore_saved_tokens_total",
                "kvstore_loaded_tokens_total", "kvstore_evicted_tokens_total")}
            for name in ("resume_total", "resume_context_tokens_total",
                         "resume_recomputed_tokens_total"):
                figures[f"offloaded_{name}"] = _metric(base, f"lengthwise_{name}",
                                                       'kv="offloaded"')
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    def share(prefix: str) -> float:
        context = figures[f"{prefix}resume_context_tokens_total"]
        return figures[f"{prefix}resume_recomputed_tokens_total"] / context if context \
            else float("nan")

    return {"mean_jct_s": statistics.fmean(jct), "p99_jct_s": float(np.percentile(jct, 99)),
            "recomputed_share": share(""), "offloaded_share": share("offloaded_"),
            **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "tiny-llama"))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--profile",
                        default=str(ROOT / "bench" / "profiles" / "tiny-llama-cpu-stack.json"))
    parser.add_argument("--blocks", type=int, default=24, help="KV blocks of 128 tokens")
    parser.add_argument("--max-running", type=int, default=2)
    parser.add_argument("--quantization", default="none", choices=["none", "int8"])
    parser.add_argument("--capacity-mib", type=int, default=512)
    parser.add_argument("--long", type=int, default=4)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--prompt", type=int, nargs=2, default=[700, 1000])
    parser.add_argument("--long-tokens", type=int, default=400)
    parser.add_argument("--short-tokens", type=int, default=16)
    parser.add_argument("--lead-s", type=float, default=1.0)
    parser.add_argument("--gap-s", type=float, default=0.3)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    for rep in range(args.reps):
        for offload in (True, False):  # alternating systems, same workload per repetition
            result = run_system(args, offload, seed=rep)
            name = "offload" if offload else "drop"
            print(f"rep {rep} {name:7s} " + " ".join(
                f"{key}={value:.3g}" for key, value in result.items()), flush=True)


if __name__ == "__main__":
    main()
