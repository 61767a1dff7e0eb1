"""Drive a server with vLLM's own benchmark client (`vllm bench serve`) instead of ours.

`bench compare --client vllm` uses this, so a claim against vLLM's server is measured by
vLLM's tool: the workload's prompts and lengths go to it as a `custom` dataset (one JSON
line each: `prompt`, `output_tokens`); vLLM's client draws its own seeded arrivals
(`--request-rate`, `--burstiness` = 1 / CV^2: Gamma inter-arrival times, as ours), sends
streaming chat completions and saves per-request times, which come back here as the same
`RequestResult`s our client produces. TTFT and JCT then count from when vLLM's client sent
the request (its open loop sends on schedule).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench import vllm_bench_serve
from bench.metrics import RequestResult
from bench.workload import Request


def burstiness(cv: float) -> float:
    """vLLM's Gamma shape for a coefficient of variation of inter-arrival times."""
    return 1.0 / (cv * cv)


def write_dataset(requests: Sequence[Request], path: Path, salt: str, natural: bool,
                  max_model_len: int) -> None:
    """vLLM's custom dataset sends each prompt as one user message: a request with a system
    prompt (or earlier turns) goes as their contents joined by blank lines, the same text
    for every system under test."""
    lines = []
    for req in requests:
        out = max(max_model_len - req.prompt_tokens - 1, 1) if natural else req.output_tokens
        lines.append(json.dumps({"prompt": as_prompt(req, salt), "output_tokens": out}))
    path.write_text("\n".join(lines) + "\n")


def as_prompt(req: Request, salt: str) -> str:
    """The one user message vLLM's client sends for a request (write_dataset)."""
    return salt + "\n\n".join(m.content for m in req.messages)


def served_model(base_url: str) -> str:
    resp = httpx.get(f"{base_url}/v1/models", timeout=30)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


# vLLM's client backends and the endpoint each sends to: streamed chat completions (what
# `bench compare` uses), or its default, streamed completions (the prompt as raw text).
ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}
_CLIENT = [sys.executable, "-m", "bench.vllm_bench_serve"]


def command(base_url: str, dataset: Path, result: Path, *, num: int, rate: float, cv: float,
            seed: int, natural: bool, tokenizer: Path, model: str,
            headers: dict[str, str] | None = None, backend: str = "openai-chat") -> list[str]:
    cmd = [*_CLIENT,
           "--backend", backend, "--endpoint", ENDPOINTS[backend],
           "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
           "--dataset-name", "custom", "--dataset-path", str(dataset),
           "--custom-output-len", "-1",  # the dataset's lengths (its default: 256 for all)
           "--disable-shuffle", "--skip-chat-template", "--num-prompts", str(num),
           "--request-rate", "inf" if math.isinf(rate) else f"{rate:g}",
           "--burstiness", f"{burstiness(cv):g}", "--seed", str(seed),
           "--temperature", "0", "--num-warmups", "0", "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--save-detailed",
           "--result-dir", str(result.parent), "--result-filename", result.name]
    if not natural:
        cmd.append("--ignore-eos")
    if headers:
        cmd += ["--header", *(f"{name}={value}" for name, value in headers.items())]
    return cmd


def results_from(saved: dict, requests: Sequence[Request]) -> list[RequestResult]:
    """vLLM's detailed result, in dataset order (--disable-shuffle), as our results."""
    starts = saved["start_times"]
    origin = min(starts) if starts else 0.0
    out = []
    for k, req in enumerate(requests[:len(starts)]):
        error = saved["errors"][k] or ""
        ok = not error and saved["ttfts"][k] > 0
        out.append(RequestResult(
            index=req.index, arrival_s=starts[k] - origin, prompt_tokens=req.prompt_tokens,
            output_tokens=int(saved["output_lens"][k]), ok=ok,
            ttft_s=saved["ttfts"][k] if ok else math.nan,
            jct_s=saved["latencies"][k] if ok else math.nan, error=error))
    return out


def result_path(work_dir: Path, tag: str) -> Path:
    """Where run() leaves what vLLM's client saved (its per-request times included)."""
    return work_dir / f"{tag}.result.json"


def run(base_url: str, requests: Sequence[Request], work_dir: Path, tag: str, *, rate: float,
        cv: float, seed: int, natural: bool, salt: str, tokenizer: Path,
        max_model_len: int, headers: dict[str, str] | None = None,
        backend: str = "openai-chat") -> list[RequestResult]:
    """One run of vLLM's client against `base_url`; its log and result stay in work_dir."""
    return run_each(base_url, requests, work_dir, {tag: backend}, rate=rate, cv=cv, seed=seed,
                    natural=natural, salt=salt, tokenizer=tokenizer,
                    max_model_len=max_model_len, headers=headers)[tag]


def run_each(base_url: str, requests: Sequence[Request], work_dir: Path,
             backends: dict[str, str], *, rate: float, cv: float, seed: int, natural: bool,
             salt: str, tokenizer: Path, max_model_len: int,
             headers: dict[str, str] | None = None) -> dict[str, list[RequestResult]]:
    """Runs of vLLM's client, tag -> its backend, one after another in one process (its
    import paid once); the log (of all) is the first tag's, each result its tag's."""
    work_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(backends))
    dataset, log_path = work_dir / f"{first}.jsonl", work_dir / f"{first}.log"
    write_dataset(requests, dataset, salt, natural, max_model_len)
    model = served_model(base_url)
    cmd: list[str] = []
    for tag, backend in backends.items():
        one = command(base_url, dataset, result_path(work_dir, tag), num=len(requests),
                      rate=rate, cv=cv, seed=seed, natural=natural, tokenizer=tokenizer,
                      model=model, headers=headers, backend=backend)
        cmd += one if not cmd else [vllm_bench_serve.THEN, *one[len(_CLIENT):]]
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    results = [result_path(work_dir, tag) for tag in backends]
    if done.returncode != 0 or not all(result.exists() for result in results):
        raise RuntimeError(f"vLLM's bench client failed (exit {done.returncode}): "
                           f"see {log_path}")
    return {tag: results_from(json.loads(result.read_text()), requests)
            for tag, result in zip(backends, results, strict=True)}
